// Package predict is the picker's model of time to first token: for a
// request on an endpoint, the time it would wait for the prefill work
// queued ahead of it, plus its own prefill of the uncached tail (a curve
// in the tail and context lengths), plus the cost of loading its matched
// blocks back from a lower tier, plus the slowdown the decodes running
// there add to every step — learned online from what the picker observes
// and what the engines report, never from a simulator's constants.
//
// Contract:
//   - Pure: no I/O, no clock reads, no randomness, no logging, no locks.
//     A Model is not safe for concurrent use; its shell (the router)
//     serializes it, and decisions read an immutable Snapshot of it, so a
//     decision never waits on learning.
//   - The fit is a recursive least squares over the terms' features
//     (Features.Vector), with exponential forgetting (Config.Forget), the
//     covariance bounded by the prior's so that a quiet spell cannot wind
//     it up, residuals clipped at Config.OutlierSigmas robust deviations
//     (one stalled request does not move it), and the coefficients kept
//     non-negative. It starts from Config.Prior: a conservative guess
//     (10,000 prefill tokens a second) the first observations overrule.
//   - Per endpoint, a speed factor (the geometric mean of observed ÷
//     predicted, exponentially weighted, clipped per observation) scales
//     the group's curve: an engine replaced by a faster or slower one is
//     learned again within a few tens of its requests, without moving the
//     group's fit.
//   - The engines' own counters (Report: vLLM's prompt and prefix-hit
//     counters, its TTFT, queue and prefill histograms) give each
//     endpoint's mean uncached prompt per request — what a waiting request
//     this picker did not send is assumed to cost — and its queue, prefill
//     and TTFT means, shown beside the picker's own figures. A counter that
//     goes down is an engine restart: the report restarts the deltas.
package predict
