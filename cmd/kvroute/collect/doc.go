// Package collect is the shell of kvroute verify: it gathers, over HTTP,
// the facts internal/verify judges — what a picker reports of its fleet,
// what each endpoint's sidecar and engine answer, and what the
// token-parity probes observe.
//
// Contract:
//   - Unlike internal/verify (pure, as internal/ packages are) it does
//     I/O, reads clocks and draws randomness: it talks to the picker (its
//     /debug/endpoints, read as the type the picker writes,
//     internal/debugapi's Document; the decision API and the OpenAI
//     endpoints), every endpoint's sidecar debug server and every engine; it draws a fresh random cache_salt for every probe. It
//     judges nothing: each pass/fail rule is internal/verify's, and Facts
//     only records what was seen, errors included, for Judge to read.
//   - Config has DefaultConfig; Validate names the flag at fault. Every
//     request is bounded by Timeout; a probe waits at most Timeout for its
//     blocks to reach its endpoint's sidecar, then a fixed moment for the
//     summary to reach the picker (polling the decision API instead would
//     count every poll as a request in flight, and could move the repeat).
//   - After the token-parity probes (whose repeats polls could move), a
//     lag probe per model sends one completion under a fresh salt straight
//     to every engine the picker routes the model to — with no wait for
//     any sidecar — then polls the explained decision API with the same
//     body every 15 ms until each endpoint's candidate matches the
//     prompt's full blocks, or gives up max(5 s, 5 × MaxLag) after that
//     engine answered; the lag is from the engine's answer to the
//     decision that showed the prediction (an upper bound, within a
//     poll). Its polls count as picks in flight on the picker, harmless
//     under a salt no other request shares. Endpoints of the model in
//     another identity group get no lag probe (nothing is routed there).
//   - Then each endpoint's sidecar stream state and engine verdict from
//     its sidecar's /debug/state entry (matched by endpoint and rank);
//     one still "unknown" after verify's requests is read again every
//     100 ms for at most 5 s. A sidecar that reports no stream_state is
//     recorded as such.
//   - The picker's endpoint picker, when its /debug/endpoints names one
//     (or Config.ExtProc does), is asked grpc.health.v1 Check for the
//     ext_proc service at that address (an unspecified host: the picker's
//     host), bounded by Timeout; over TLS without checking the
//     certificate when it serves TLS (a health probe sends nothing), not
//     at all when it requires client certificates (recorded why).
//   - Last, /metrics on the picker's admin port and on each sidecar's
//     (each once): the names of the series served (Prometheus's text
//     format, at most 64 MiB), or why it was not served.
//   - Facts fails only when verify cannot run at all: the picker does not
//     answer, knows no endpoint (of the model asked for), or its decision
//     API fails on a first request — one wanting a token says so, with
//     the flag that gives it. Everything else is a fact.
//   - Probes are small: a few hundred prompt tokens and one output token,
//     sent to the engines directly and through the picker; Responses
//     probes are not stored.
//   - HTTP errors are *openai.StatusError, reading "url: status N: body"
//     as before; callers test them with errors.As.
package collect
