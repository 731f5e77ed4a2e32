package stats

import (
	"math"
	"time"
)

// Point is one step of a load sweep: the offered rate (requests per
// second), the p90 time to first token of the requests that completed,
// and how many requests were offered and how many completed (a request
// refused with 429, or failed, did not complete).
type Point struct {
	Rate      float64
	P90TTFT   time.Duration
	Completed int
	Offered   int
}

// Passes reports whether the point meets the goodput condition for slo:
// P90TTFT ≤ slo and at least 99% of the offered requests completed
// (100·Completed ≥ 99·Offered, in integers). A point with nothing
// offered, or a NaN rate, does not pass.
func (p Point) Passes(slo time.Duration) bool {
	return p.Offered > 0 && !math.IsNaN(p.Rate) && p.P90TTFT <= slo && 100*int64(p.Completed) >= 99*int64(p.Offered)
}

// Goodput is the highest offered rate among the points that pass (see
// Point.Passes), taken literally: each point is judged on its own and
// the order of points does not matter, so a passing rate counts even
// when a lower rate failed. ok is false when no point passes (rate is
// then 0). Repeated runs at one rate are separate points here; a caller
// that wants them pooled merges them first.
func Goodput(points []Point, slo time.Duration) (rate float64, ok bool) {
	for _, p := range points {
		if p.Passes(slo) && (!ok || p.Rate > rate) {
			rate, ok = p.Rate, true
		}
	}
	return rate, ok
}
