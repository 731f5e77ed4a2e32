// Package intake reads the bodies the picker routes — OpenAI chat
// completions, completions, Responses, and the decision API's token body —
// into what routing needs: the model, the cache identity (cache_salt),
// token ids when the caller sent them, whether the request streams, and the
// body of its anchor (the conversation up to its first user message) for
// the prefix hash.
//
// Contract:
//   - Pure: no I/O. Parse never panics on any input, bounds what it
//     allocates by the body's size, and words every refusal as an *Error
//     carrying the HTTP status and an OpenAI-style error (type, code,
//     param, message).
//   - A Responses request still carrying previous_response_id is refused
//     (400, code "unresolved_previous_response"): the caller must rehydrate
//     the conversation first. An identity that cannot be resolved exactly
//     is not refused here but reported in Request.Unresolved, for the
//     picker's --unresolved policy.
//   - A completions batch (a list of texts, or of token-id lists; one
//     form, as vLLM requires) is routed by its first prompt: Prompts
//     counts them, TokenIDs are the first one's ids, or RenderBody renders
//     the first text alone.
//   - The body is forwarded as received; Parse never rewrites it.
//   - Parser.Model reads just the model of a body the picker forwards
//     without routing on its content (pooling, tokenize), with Parse's
//     refusals of a body that is no JSON object or names no model.
//   - Text reads a body's text as a character-level router does (the
//     sglang peer policy), with a parse of its own: only that policy pays
//     for it.
package intake
