package picker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// BenchmarkPickDecisionFleet is BenchmarkPickDecision at fleet scale
// (issue 21): Router.Pick on token-id bodies (no render call) of 8k and
// 128k tokens, over 1 (the body's parse and keys, next to nothing
// matched), 64, 256 and 1,000 simulated endpoints (full
// 65,536-block summaries, no churn: still sidecars, only their streams'
// load reports), two endpoints of the request's model holding each of the
// 32 prompts' prefixes at random depths; p50 and p99 reported. Target at
// 1,000 endpoints in one model: p99 ≤ 1 ms.
func BenchmarkPickDecisionFleet(b *testing.B) {
	for _, s := range []struct{ endpoints, models int }{{1, 1}, {64, 1}, {256, 1}, {1000, 1}} {
		b.Run(fmt.Sprintf("endpoints=%d/models=%d", s.endpoints, s.models), func(b *testing.B) {
			r, sims, reg := stillFleet(b, s.endpoints, s.models)
			per := s.endpoints / s.models
			model := "sim"
			if s.models > 1 {
				model = "m00"
			}
			for _, tokens := range []int{8192, 131072} {
				prompts := randomPrompts(32, tokens)
				holdPrefixes(b, sims[:per], model, prompts, "t")
				awaitDeltas(b, reg, sims)
				bodies := make([][]byte, len(prompts))
				for i, p := range prompts {
					bodies[i] = tokenBodyFor(model, p, "t")
				}
				b.Run(fmt.Sprintf("tokens=%d", tokens), func(b *testing.B) {
					if _, err := r.Route(context.Background(), intake.Tokens, bodies[0], picker.PickOptions{}); err != nil { // the model list
						b.Fatal(err)
					}
					benchPicks(b, r, bodies)
				})
			}
		})
	}
}

func tokenBodyFor(model string, p []uint32, salt string) []byte {
	return fmt.Appendf(nil, `{"model":%q,"cache_salt":%q,"token_ids":%s}`, model, salt, jsonInts(p))
}

func jsonInts(p []uint32) []byte {
	out := []byte{'['}
	for i, t := range p {
		if i > 0 {
			out = append(out, ',')
		}
		out = fmt.Appendf(out, "%d", t)
	}
	return append(out, ']')
}

// stillFleet is a router over n still simulated sidecars (full
// 65,536-block summaries) in models of n/models (named m00, m01, …; one
// model: "sim"), once every endpoint's snapshot is loaded into the index.
func stillFleet(b *testing.B, n, models int) (*picker.Router, []*simsidecar.Sidecar, *prometheus.Registry) {
	b.Helper()
	params := summary.ForCapacity(65536)
	vcfg := fleetview.DefaultConfig()
	vcfg.Params, vcfg.Retry = params, 50*time.Millisecond
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(vcfg, zap.NewNop(), reg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(v.Close)
	var sims []*simsidecar.Sidecar
	for i := range n {
		cfg := simsidecar.Config{Index: i, Params: params, Still: true}
		if models > 1 {
			cfg.Model = fmt.Sprintf("m%02d", i/(n/models))
		}
		s := simsidecar.Start(b, cfg)
		sims = append(sims, s)
		v.Watch(s.Addr())
	}
	// The snapshot counter counts loads started; a load is done once a
	// later update from its stream (a load report, every 200 ms) is in.
	deadline := time.Now().Add(2 * time.Minute)
	testnet.Await(b, 2*time.Minute, 10*time.Millisecond, func() error {
		if got := counterValue(b, reg, "kvroute_picker_summary_updates_total", "snapshot"); got < float64(n) {
			return fmt.Errorf("%v of %d snapshots in", got, n)
		}
		return nil
	})
	awaitUpdatedSince(b, v, n, time.Now(), time.Until(deadline))
	return simRouter(b, v, prometheus.NewRegistry()), sims, reg
}

// awaitUpdatedSince polls until the view follows n endpoints and has
// applied an update from each since t (its streams in order: whatever
// they sent before t is in), failing b past within.
func awaitUpdatedSince(b *testing.B, v *fleetview.View, n int, t time.Time, within time.Duration) {
	b.Helper()
	testnet.Await(b, within, 10*time.Millisecond, func() error {
		eps := v.Endpoints()
		updated := 0
		for _, e := range eps {
			if e.LastUpdate.After(t) {
				updated++
			}
		}
		if len(eps) != n || updated != n {
			return fmt.Errorf("%d endpoints followed, %d updated since the start, want %d", len(eps), updated, n)
		}
		return nil
	})
}

// benchPicks times Router.Pick on bodies, round robin, b.N times, and
// reports p50 and p99.
func benchPicks(b *testing.B, r *picker.Router, bodies [][]byte) {
	lat := make([]time.Duration, 0, b.N)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
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
}

// holdPrefixes makes two random sidecars of sims hold each prompt's
// prefix at a random depth, and returns once the view has applied the
// deltas they sent (still sidecars send one at each Hold).
func holdPrefixes(b *testing.B, sims []*simsidecar.Sidecar, model string, prompts [][]uint32, salt string) {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range prompts {
		chain := (&blockkey.Request{Tokens: p, CacheSalt: salt}).AppendKeys(nil, model, 16)
		for range 2 {
			sims[rng.IntN(len(sims))].Hold(chain[:rng.IntN(len(chain)+1)]...)
		}
	}
}

// awaitDeltas returns once the view (registering on reg) has applied
// every delta the still sidecars sims have published: one a Hold.
func awaitDeltas(b *testing.B, reg *prometheus.Registry, sims []*simsidecar.Sidecar) {
	b.Helper()
	var want int64
	for _, s := range sims {
		want += s.Deltas()
	}
	testnet.Await(b, 30*time.Second, 5*time.Millisecond, func() error {
		if got := counterValue(b, reg, "kvroute_picker_summary_updates_total", "delta"); got < float64(want) {
			return fmt.Errorf("%v of the holds' %d deltas applied", got, want)
		}
		return nil
	})
}

func counterValue(b *testing.B, reg *prometheus.Registry, name, kind string) float64 {
	b.Helper()
	return metrictest.Gathered(b, reg, name, map[string]string{"kind": kind})
}

// reportLatencies reports lat's median and 99th percentile (sorting it)
// as the benchmark's p50-µs and p99-µs.
func reportLatencies(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
