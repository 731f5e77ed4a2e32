package stats

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestGoodput(t *testing.T) {
	ms := time.Millisecond
	const slo = 200 * time.Millisecond
	ok := func(rate float64, p90 time.Duration) Point {
		return Point{Rate: rate, P90TTFT: p90, Completed: 100, Offered: 100}
	}
	monotone := []Point{ok(1, 50*ms), ok(2, 80*ms), ok(4, 150*ms), ok(8, 300*ms), ok(16, 900*ms)}
	for _, c := range []struct {
		name   string
		points []Point
		rate   float64
		ok     bool
	}{
		{"monotone: the last rate under the SLO", monotone, 4, true},
		{"order does not matter", []Point{monotone[3], monotone[0], monotone[4], monotone[2], monotone[1]}, 4, true},
		{"p90 equal to the SLO passes", []Point{ok(1, 50*ms), ok(2, slo), ok(3, slo+1)}, 2, true},
		{"non-monotone: a passing rate above a failing one counts", []Point{ok(1, 50*ms), ok(2, 250*ms), ok(4, 190*ms), ok(8, 400*ms)}, 4, true},
		{"non-monotone on completion", []Point{ok(1, 50*ms), {Rate: 2, P90TTFT: 60 * ms, Completed: 90, Offered: 100}, ok(3, 70*ms)}, 3, true},
		{"none passing", []Point{ok(1, 250*ms), ok(2, 300*ms)}, 0, false},
		{"no points", nil, 0, false},
		{"429s bring completion under 99%", []Point{
			ok(1, 50*ms),
			{Rate: 2, P90TTFT: 60 * ms, Completed: 99, Offered: 100},   // 1 refused: 99%, passes
			{Rate: 4, P90TTFT: 70 * ms, Completed: 98, Offered: 100},   // 2 refused: fails, however fast
			{Rate: 8, P90TTFT: 80 * ms, Completed: 989, Offered: 1000}, // 98.9%: fails
		}, 2, true},
		{"99.0% of 1000 passes", []Point{ok(1, 50*ms), {Rate: 5, P90TTFT: 80 * ms, Completed: 990, Offered: 1000}}, 5, true},
		{"every request refused", []Point{{Rate: 1, P90TTFT: 0, Completed: 0, Offered: 50}}, 0, false},
		{"nothing offered does not pass", []Point{ok(1, 50*ms), {Rate: 2, P90TTFT: 0, Completed: 0, Offered: 0}}, 1, true},
		{"a NaN rate does not pass", []Point{ok(1, 50*ms), ok(math.NaN(), 50*ms)}, 1, true},
		{"repeats at a rate are separate points", []Point{ok(2, 50*ms), ok(2, 300*ms), ok(1, 40*ms)}, 2, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := slices.Clone(c.points)
			rate, ok := Goodput(c.points, slo)
			if rate != c.rate || ok != c.ok {
				t.Errorf("Goodput = %v, %v; want %v, %v", rate, ok, c.rate, c.ok)
			}
			if !slices.EqualFunc(before, c.points, func(a, b Point) bool {
				return math.Float64bits(a.Rate) == math.Float64bits(b.Rate) && a.P90TTFT == b.P90TTFT && a.Completed == b.Completed && a.Offered == b.Offered
			}) {
				t.Error("Goodput changed its argument")
			}
		})
	}
}

// TestPointPassesLargeCounts: the completion test is in integers that
// do not overflow at counts far past any sweep's.
func TestPointPassesLargeCounts(t *testing.T) {
	big := math.MaxInt32
	if !(Point{Rate: 1, Completed: big, Offered: big}).Passes(time.Second) {
		t.Error("all of MaxInt32 completed did not pass")
	}
	if (Point{Rate: 1, Completed: big / 2, Offered: big}).Passes(time.Second) {
		t.Error("half of MaxInt32 completed passed")
	}
}
