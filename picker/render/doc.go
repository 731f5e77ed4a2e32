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
//
// Coalescing (issue 21): a Coalescer shares one render call among
// identical concurrent callers, keyed by identity group, kind, attempt and
// body (a hash, the body compared on joining), never the engine: engines
// of a group render alike. The first caller starts the call; later ones
// wait for its answer or failure, which all share. Every caller leaves
// when its own context ends, with its own ctx.Err(), and never ends the
// call for the others: the call runs with a context of its own that ends
// only when every caller has left or the coalescer's limit passes. A
// cancellation a caller did not cause is retried (at most twice). Each
// caller gets its own copy of the token ids and media items. An entry
// lives exactly as long as its call, so the table holds only what is in
// flight.
package render
