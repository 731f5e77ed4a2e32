// Package chat is the tokenizer and chat template of the simulated vLLM
// engine (kvroute engine), plus parsing of OpenAI request bodies into chat
// messages.
//
// The package is pure: no I/O, clocks, randomness, logging or mutable
// global state. The same input always gives the same tokens.
//
// # Tokenizer
//
// Ids below [FirstPieceID] are reserved: [EndOfText] "<|endoftext|>",
// [ImStart] "<|im_start|>", [ImEnd] "<|im_end|>"; the other reserved ids
// decode as "<|reserved_N|>". Special tokens are never recognised in text.
//
// [Encode] splits text, as bytes, into pieces of 1 to 3 bytes, left to right,
// greedily:
//   - a word — a run of ASCII letters, digits and bytes >= 0x80 — optionally
//     preceded by one ' ' (0x20 only), is cut into chunks of at most 3 bytes,
//     the leading space counting toward the first chunk;
//   - a run of whitespace (' ', '\t', '\n', '\r') is cut into chunks of at most
//     3 bytes, except that a final ' ' directly followed by a word byte
//     becomes that word's leading space;
//   - any other byte is a piece of its own.
//
// A piece maps to an id bijectively: 1 byte b0 → FirstPieceID+b0; 2 bytes →
// FirstPieceID+256+(b0<<8|b1); 3 bytes → FirstPieceID+256+65536+
// (b0<<16|b1<<8|b2). Hence [VocabSize] = FirstPieceID+256+65536+16777216.
// [Decode] concatenates the pieces, so Decode(Encode(s), false) == s for every
// s, and len(Encode(s)) <= len(s).
//
// # Chat template
//
// [Render] uses a ChatML-like (Qwen style) template. The token sequence is a
// concatenation of segments, each tokenized separately, so tokens never
// straddle a segment boundary:
//   - if there are tools, a system turn first: ImStart, "system", "\n"; then,
//     if the first message is a system or developer message, its content and
//     "\n\n" (the message is consumed); then "# Tools\n"; then for each tool
//     its one-line JSON {"type":"function","function":{"name","description",
//     "parameters"}} (description omitted when empty, parameters when absent,
//     parameters compacted) and "\n"; then ImEnd, "\n";
//   - each remaining message: ImStart, role ("developer" renders as
//     "system"), "\n", then for a tool message "<tool_response>\n", content,
//     "\n</tool_response>"; otherwise the content followed, for each tool call
//     of an assistant message, by "\n<tool_call>\n",
//     {"name": <JSON string>, "arguments": <arguments as given, or {}>} and
//     "\n</tool_call>"; then ImEnd, "\n" — except after the last message when
//     ContinueFinalMessage is set (which requires that message to be an
//     assistant message);
//   - with AddGenerationPrompt: ImStart, "assistant", "\n".
//
// An assistant message's Reasoning is not rendered (as in Qwen2.5's
// template; Qwen3's renders it after the last user turn only).
//
// AddGenerationPrompt and ContinueFinalMessage together are an error. For a
// non-empty conversation C and any continuation C' = C + [assistant reply] +
// [more messages], Render(C) with or without the generation prompt is a token
// prefix of Render(C') with or without it.
//
// # Requests
//
// [ParseChatMessages] and [ParseChatTools] parse the "messages" and "tools"
// of /v1/chat/completions. Multimodal content parts give an
// [*UnsupportedError].
//
// [ParseResponsesInput] maps a stateless Responses API request to messages:
//   - non-empty instructions → a first system message;
//   - input as a string → one user message;
//   - input items of type "message" (or without a type but with a role), role
//     user, system, developer or assistant, content a string or parts:
//     "input_text", "output_text" (field "text") and "refusal" (field
//     "refusal") are concatenated — for an assistant message only the first
//     part's "text" is kept, as vLLM does; "input_image", "input_file" and
//     "input_audio" give an *UnsupportedError;
//   - "function_call" items (call_id, name, arguments) become tool calls of an
//     assistant message;
//   - "function_call_output" items (call_id, output: a string or text parts)
//     become tool messages;
//   - "reasoning" items (id and summary required; content, encrypted_content,
//     status optional) become an assistant message's Reasoning: the first
//     content part's text, else the first summary part's, else "";
//     encrypted_content is ignored;
//   - contiguous assistant-side items share one assistant message, as in
//     vLLM's non-Harmony path since PR #42189: an item merges into the
//     assistant message just before it when that message lacks what the item
//     brings (a reasoning item its reasoning, an assistant message its
//     content); function calls always append; otherwise a new assistant
//     message starts;
//   - other item types are errors;
//   - function tools [{"type":"function","name","description","parameters"}]
//     become tools; other tool types give an *UnsupportedError.
//
// Errors name the offending field, e.g. `messages[2].role: unknown role "bot"`.
//
// The package is a pure core: no I/O, clock, randomness, goroutines, locks
// or logging (test/repo's core rules).
package chat
