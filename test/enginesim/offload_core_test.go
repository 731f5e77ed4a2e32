
package enginesim

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// startedPull runs a pull the way the loop does: started on the scheduler
// goroutine for a request it holds; the loop takes the outcome (the core
// finds no lookup of that request to resolve) and counts it. A lookup for
// a request that left is resolved as failed at once.
func startedPull(t *testing.T, e *Engine, src string, hs []blockkey.Digest) {
	t.Helper()
	if err := e.do(func() {
		e.live[9] = &request{box: newMailbox(), source: kvSource{peer: src, kvRequestID: "kv-9"}}
		e.startPulls([]lookup{{id: 9, source: src, hashes: hs[:2]}, {id: 10, source: src, hashes: hs}})
	}); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		if got := metrictest.Gathered(t, e.reg, "vllm:kv_offload_tiering_block_queries_total", nil); got != 14 {
			return fmt.Errorf("%v blocks probed", got)
		}
		return nil
	})
	if err := e.do(func() { delete(e.live, 9) }); err != nil {
		t.Fatal(err)
	}
}
