// Package pod starts what one vLLM pod runs, for tests: a simulated engine
// (`test/enginesim`) publishing KV events with a replay socket, and its
// sidecar following it, everything on 127.0.0.1 with ports picked at run
// time and stopped when the test ends.
package pod
