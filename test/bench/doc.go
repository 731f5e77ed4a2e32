// Package bench runs kvroute's routing benchmarks: a fleet of simulated
// vLLM engines (`kvroute engine`), a sidecar each and a picker, all over
// real sockets on 127.0.0.1 in this process, driven by a scenario once per
// routing policy — a fresh fleet for each, so no policy inherits another's
// cache — and summarised in results.json and a table (DESIGN.md §9).
//
// Contract:
//   - Every request goes through the picker's OpenAI endpoints, exactly as
//     a client (agentic-api) sends it; outcomes are what the engines
//     report (usage cached tokens) and what the client sees (time to the
//     first streamed byte, the x-kvroute-endpoint header).
//   - The pooled bound is computed offline: one LRU cache of the fleet's
//     total size replaying the same requests in the same order, keyed by
//     the engine-exact tokens (rendered by an engine).
//   - A run fails (an error) when a component fails or a request errors
//     unexpectedly; the figures of a failed run are not reported as if it
//     had succeeded.
package bench
