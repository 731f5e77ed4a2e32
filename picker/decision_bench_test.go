package picker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker"
	fleetpkg "github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/localfleet"
)

// BenchmarkPickDecisionInProcess is the decision alone at fleet scale
// (issue 37): Router.Route on 8k-token token-id bodies (no render call)
// over 1, 256 and 1,000 endpoints of one model in an in-process fleet
// (picker/localfleet: no streams, no sidecars, nothing else on the
// cores), full 65,536-block summaries (64 distinct ones, shared round
// robin), two endpoints holding each of the 32 prompts' prefixes at
// random depths, every endpoint with a load report. The router's clock
// steps 1 ms a decision (1,000 decisions a second) and between two
// decisions the endpoints report their loads at 5 a second each, round
// robin (5,000 reports a second at 1,000 endpoints), so the group's
// endpoints change between every two decisions as they would. p50 and
// p99 of a decision are reported, with the allocations.
func BenchmarkPickDecisionInProcess(b *testing.B) {
	prompts := randomPrompts(32, 8192)
	bodies := make([][]byte, len(prompts))
	for i, p := range prompts {
		bodies[i] = tokenBodyFor("sim", p, "t")
	}
	for _, n := range []int{1, 256, 1000} {
		b.Run(fmt.Sprintf("endpoints=%d/tokens=8192", n), func(b *testing.B) {
			clock := &manualClock{}
			clock.set(time.Unix(1_000_000, 0))
			lf, urls := inProcessFleet(b, n, prompts, clock.now())
			cfg := picker.DefaultConfig()
			cfg.Clock = clock.now
			r, err := picker.NewRouter(cfg, lf, zap.NewNop(), prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(r.Close)
			ctx := context.Background()
			if _, err := r.Route(ctx, intake.Tokens, bodies[0], picker.PickOptions{}); err != nil { // the model list
				b.Fatal(err)
			}
			next, owed := 0, 0.0 // the next endpoint to report, and the reports owed
			report := func(now time.Time) {
				for owed += float64(5*len(urls)) / 1000; owed >= 1; owed-- {
					u := urls[next%len(urls)]
					lf.SetLoad(u, fleetpkg.Load{Waiting: float64(next % 3), Running: float64(next % 7), KVCacheUsage: 0.5}, now)
					next++
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				now := clock.advance(time.Millisecond)
				b.StopTimer()
				report(now)
				b.StartTimer()
				t0 := time.Now()
				p, err := r.Route(ctx, intake.Tokens, bodies[i%len(bodies)], picker.PickOptions{})
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
				r.Done(p)
			}
			b.StopTimer()
			reportLatencies(b, lat)
		})
	}
}

// manualClock is a clock a benchmark steps.
type manualClock struct{ t atomic.Int64 }

func (c *manualClock) set(t time.Time) { c.t.Store(t.UnixNano()) }
func (c *manualClock) now() time.Time  { return time.Unix(0, c.t.Load()) }
func (c *manualClock) advance(d time.Duration) time.Time {
	return time.Unix(0, c.t.Add(int64(d)))
}

// inProcessFleet is an in-process fleet (not in sync: as fresh as its
// load reports) of n endpoints of the model "sim", each with a full
// summary (64 distinct ones, shared round robin; the holders' own) and a
// load report at now; two random endpoints hold each prompt's prefix at
// a random depth, as in BenchmarkPickDecisionFleet.
func inProcessFleet(b *testing.B, n int, prompts [][]uint32, now time.Time) (*localfleet.Fleet, []string) {
	b.Helper()
	params := summary.ForCapacity(65536)
	cfg := localfleet.DefaultConfig()
	cfg.Params, cfg.InSync = params, false
	cfg.Clock = func() time.Time { return now }
	lf, err := localfleet.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	full := func() *summary.Counting {
		c := summary.NewCounting(params)
		for range params.M / summary.BitsPerBlock {
			c.Add(blockkey.Key(rng.Uint64()))
		}
		return c
	}
	held := map[int][]blockkey.Key{} // endpoint → the prefixes it holds
	for _, p := range prompts {
		chain := (&blockkey.Request{Tokens: p, CacheSalt: "t"}).AppendKeys(nil, "sim", 16)
		for range 2 {
			i := rng.IntN(n)
			held[i] = append(held[i], chain[:rng.IntN(len(chain)+1)]...)
		}
	}
	var shared []summary.Snapshot
	for range min(n, 64) {
		c := full()
		c.TakeDelta()
		shared = append(shared, c.Snapshot())
	}
	urls := make([]string, n)
	for i := range n {
		urls[i] = fmt.Sprintf("http://127.0.%d.%d:9", i/250, i%250+1) // nothing listens: the model list is refused at once
		id := fleetpkg.Identity{Endpoint: urls[i], Model: "sim", BlockSize: 16, NumGPUBlocks: 65536, KeyFormat: blockkey.FormatV1,
			SummaryParams: params.String(), TokenizerFingerprint: "bench"}
		if err := lf.Register(id, now); err != nil {
			b.Fatal(err)
		}
		snap := shared[i%len(shared)]
		if ks := held[i]; len(ks) > 0 {
			c := full()
			for _, k := range ks {
				c.Add(k)
			}
			c.TakeDelta()
			snap = c.Snapshot()
		}
		if err := lf.Receive(localfleet.Update{Endpoint: urls[i], Tier: tier.GPU, Epoch: 1, Snapshot: &snap}, now); err != nil {
			b.Fatal(err)
		}
		lf.SetLoad(urls[i], fleetpkg.Load{KVCacheUsage: 0.5}, now)
	}
	return lf, urls
}
