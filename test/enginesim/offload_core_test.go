package enginesim

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/test/enginesim/p2p/p2ptest"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
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

// tieringEngine starts one engine with the CPU and P2P tiers on loopback,
// at time scale 0, after edit; it is closed when the test ends.
func tieringEngine(t *testing.T, edit func(*Config)) *Engine {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Host, cfg.Port, cfg.Sim.TimeScale = "127.0.0.1", 0, 0
	k, err := ParseKVTransferConfig(`{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":
		{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":1e9,"secondary_tiers":[{"type":"p2p","host":"127.0.0.1"}]}}`)
	if err != nil {
		t.Fatal(err)
	}
	cfg.KVTransfer, cfg.P2PSideChannelPort = k, 0
	if edit != nil {
		edit(&cfg)
	}
	p, err := Start(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p.Engines()[0]
}

// heldBy is a source holding every block asked about, with pulls under
// way as active says.
func heldBy(t *testing.T, e *Engine, active int) *p2ptest.Source {
	return p2ptest.NewSource(t, e.cfg.p2pFingerprint(), func(op string, n int) map[string]any {
		if op == "lookup" {
			return map[string]any{"type": "lookup_resp", "hits": n, "active": active}
		}
		return map[string]any{"type": "transfer_done", "success": true, "blocks": n}
	})
}

// TestPullTimeout: a pull whose transfer would outlast transfer.PullTimeout
// (vLLM's _LOAD_TIMEOUT_S; a link far too slow for the prefix, or a time
// past what a Duration holds) fails as a timeout at its start + the
// timeout, with nothing loaded, and is counted by reason; one within it
// loads. No wait is ever negative, whatever the source reports.
func TestPullTimeout(t *testing.T) {
	hs := make([]blockkey.Digest, 4)
	for i := range hs {
		hs[i] = sha256.Sum256([]byte{byte(i)})
	}
	for _, c := range []struct {
		name string
		// bps is the pull bandwidth as a share of the bytes pulled a
		// second: 1/1000 is a 1000 s transfer.
		bps      float64
		active   int
		timedOut bool
	}{
		{"within the timeout", 1, 0, false},
		{"a 1000 s transfer", 1.0 / 1000, 0, true},
		{"a transfer past a Duration's range", 1e-300, 0, true},
		{"a source reporting 2^62 pulls under way", 1, 1 << 62, true},
		{"a source reporting the int's bound", 1, math.MaxInt64, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := tieringEngine(t, func(cfg *Config) {
				p := cfg.Sim.Profile()
				cfg.Sim.Latency.PullBytesPerSecond = p.KVBytesPerToken * float64(len(hs)*cfg.BlockSize) * c.bps
			})
			src := heldBy(t, e, c.active)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d := e.pull(ctx, lookup{id: 7, source: src.ID, hashes: hs, at: time.Second}, "kv-7")
			if d.wait < 0 || d.wait > transfer.PullTimeout {
				t.Fatalf("pull: %+v: a wait outside [0, %v]", d, transfer.PullTimeout)
			}
			if c.timedOut {
				if !d.failed || d.reason != "timeout" || d.blocks != 0 || d.wait != transfer.PullTimeout {
					t.Fatalf("pull: %+v, want a timeout after %v, nothing loaded", d, transfer.PullTimeout)
				}
			} else if d.failed || d.blocks != len(hs) || d.wait <= 0 {
				t.Fatalf("pull: %+v, want %d blocks loaded after a positive wait", d, len(hs))
			}
			e.metrics.offload.observePull(d)
			want := 0.0
			if c.timedOut {
				want = 1
			}
			if got := metrictest.Gathered(t, e.reg, "kvroute_engine_p2p_pull_failures_total", map[string]string{"reason": "timeout"}); got != want {
				t.Errorf("%v timeouts counted, want %v", got, want)
			}
		})
	}
}
