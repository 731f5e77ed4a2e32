// Package render gets a request's engine-exact token ids from an engine of
// its identity group: vLLM's render endpoints (/v1/chat/completions/render,
// /v1/completions/render, /v1/responses/render), which run the engine's own
// preprocessing (chat template, tools, defaults); a Responses request on an
// engine without Responses render is mapped to chat messages (and says so
// in Rendered.Via); /tokenize is the last resort. The picker never
// tokenizes or templates anything itself.
//
// Contract: every call is bounded by the client's timeout and its answer's
// size; connections are pooled per engine; an engine's refusal (4xx) comes
// back as a *RefusedError carrying its status and body, so the picker can
// pass the engine's own error to the caller.
package render
