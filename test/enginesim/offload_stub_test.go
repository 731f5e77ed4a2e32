//go:build !enginesim_core

package enginesim

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// startedPull runs a pull the way the loop will once the core's lookups
// land (with the core, the loop takes e.pulls itself, and the two-engine
// test covers this): started on the scheduler goroutine for a request it
// holds, the outcome back on e.pulls, taken there; a lookup for a request
// that left is dropped.
func startedPull(t *testing.T, e *Engine, src string, hs []blockkey.Digest) {
	t.Helper()
	if err := e.do(func() {
		e.live[9] = &request{box: newMailbox(), source: kvSource{peer: src, kvRequestID: "kv-9"}}
		e.startPulls([]lookup{{id: 9, source: src, hashes: hs[:2]}, {id: 10, source: src, hashes: hs}})
	}); err != nil {
		t.Fatal(err)
	}
	var d pullDone
	select {
	case d = <-e.pulls:
	case <-time.After(10 * time.Second):
		t.Fatal("no pull came back")
	}
	if d.id != 9 || d.blocks != 2 || d.failed {
		t.Fatalf("started pull: %+v", d)
	}
	if err := e.do(func() { e.takePull(d); delete(e.live, 9) }); err != nil {
		t.Fatal(err)
	}
}
