package enginesim

import (
	"fmt"
	"slices"
	"strings"
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

// TestKVTransferConfigTrailingData: --kv-transfer-config is one JSON object;
// anything but white space after it is refused, saying so.
func TestKVTransferConfigTrailingData(t *testing.T) {
	const obj = `{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"cpu_bytes_to_use":1e9}}`
	if _, err := ParseKVTransferConfig(obj + " \n\t"); err != nil {
		t.Fatalf("trailing white space: %v", err)
	}
	for _, tail := range []string{" x", "}", " {}", " " + obj, "null", ","} {
		_, err := ParseKVTransferConfig(obj + tail)
		if err == nil || !strings.Contains(err.Error(), "trailing data") {
			t.Errorf("%q after the object: %v, want a trailing-data error", tail, err)
		}
	}
}

// TestP2PTierWarningsSorted: the P2P tier's ignored keys are warned about
// in a stable (sorted) order, whatever the map's iteration order.
func TestP2PTierWarningsSorted(t *testing.T) {
	tier := `{"type":"p2p","zeta":1,"alpha":2,"mu":3,"beta":4,"omega":5,"gamma":6,"kappa":7,"delta":8}`
	for range 20 { // map iteration is random: one sorted run proves nothing
		k, err := ParseKVTransferConfig(`{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":
			{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":1e9,"secondary_tiers":[` + tier + `]}}`)
		if err != nil {
			t.Fatal(err)
		}
		if len(k.Warnings) != 8 || !slices.IsSorted(k.Warnings) {
			t.Fatalf("warnings %q: want the 8 ignored keys, sorted", k.Warnings)
		}
	}
}
