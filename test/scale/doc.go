// Package scale holds the fleet-scale benchmarks of the picker (issue 21):
// up to a thousand simulated sidecars (test/simsidecar: real gRPC servers,
// real summaries filled to capacity) served from the benchmark process,
// followed by the real kvroute binary run as one or more separate picker
// processes through --sidecars, gossip off. The figures are the picker's
// resident memory (VmRSS, VmHWM from /proc), its time from start to every
// endpoint's snapshot applied and written (its GET /debug/sync, polled;
// /metrics for a picker without it), to every endpoint credited its
// prefix by a decision and to every endpoint routed its canary, its CPU
// time (/proc/<pid>/stat) idle and under a paced
// decision load, and the sidecars' outbound bytes for one and four pickers.
//
// Contract: everything binds 127.0.0.1 on ports chosen at run time; every
// wait polls a condition under a deadline, through testnet.Await (the only
// fixed waits are the measurement windows themselves and the pacing of
// the decision load); every process started is killed when
// its benchmark ends. Nothing runs without -bench: the package has no
// tests. See docs/benchmarks.md, "Issue 21:
// fleet scale", for the commands and the figures.
package scale
