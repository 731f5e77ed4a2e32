package picker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/test/simsidecar"
)

// BenchmarkPickPartitioned: the router's whole decision (parse, keys,
// the group's endpoints, per-tier matches, loads, scoring) for a
// 1,024-token request of a 20-endpoint model, with the fleet holding
// only that model and with it holding 50 models of 20 endpoints (1,000
// simulated sidecars). Issue 21: a request's cost is bounded by its
// identity group, so both must cost the same.
func BenchmarkPickPartitioned(b *testing.B) {
	for _, models := range []int{1, 50} {
		b.Run(fmt.Sprintf("fleet=%d", models*20), func(b *testing.B) {
			v, _ := simViewWith(b, models*20, func(i int, c *simsidecar.Config) {
				c.Params, c.Interval = summary.ForCapacity(4096), time.Hour // full summaries, no churn
				c.Model = fmt.Sprintf("model-%d", i/20)
			})
			r := simRouter(b, v, prometheus.NewRegistry())
			prompts := randomPrompts(32, 1024)
			bodies := make([][]byte, len(prompts))
			for i, p := range prompts {
				bodies[i], _ = json.Marshal(map[string]any{"model": "model-0", "token_ids": p})
			}
			ctx := context.Background()
			pick := func(i int) {
				p, err := r.Route(ctx, intake.Tokens, bodies[i%len(bodies)], picker.PickOptions{})
				if err != nil {
					b.Fatal(err)
				}
				r.Done(p)
			}
			pick(0) // the model directory learns the names
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				pick(i)
			}
		})
	}
}
