// Package openai holds the OpenAI wire shapes kvroute reads from engines
// and pickers: the prompt accounting of a response (usage, with its cached
// tokens) and the error body of a refused request.
//
// Contract:
//   - Pure: no I/O, clocks or randomness; every function takes bytes and
//     returns values.
//   - Usage reads both forms vLLM answers with: prompt_tokens and
//     prompt_tokens_details.cached_tokens (chat, completions, their final
//     stream chunk with include_usage) and input_tokens and
//     input_tokens_details.cached_tokens (Responses). It is found at the top
//     level of a body or event, or inside "response" (a Responses object in
//     response.completed and other response.* events). Where both forms
//     appear, prompt_tokens and prompt_tokens_details win.
//   - A usage without prompt_tokens and input_tokens is not seen (Seen
//     false, everything zero). Details is false when the usage has no
//     details object: vLLM omits it when nothing was cached, and always
//     without --enable-prompt-tokens-details, so its absence is not
//     evidence of a miss.
//   - UsageOf never fails: data that is not JSON, or has no usage, gives
//     the zero Usage (an SSE stream carries many events without one).
//     DecodeUsage is the same for a whole body that must be JSON.
//   - An answer with an unwanted status becomes a *StatusError
//     (NewStatusError, from the URL, status and body the caller read): the
//     status, the OpenAI error object when the body holds one ({"error":
//     {"message", "type", "param", "code"}}, code a string or a number),
//     and the body's first BodyExcerpt characters for the message, which
//     reads "url: status N: body" as kvroute's messages always have.
//     Callers test it with errors.As, never by matching the message.
package openai
