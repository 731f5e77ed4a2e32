package stats

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPCGIsMathRand: the bootstrap's generator draws what math/rand/v2's
// PCG draws, value for value, raw and bounded (powers of two, n = 1,
// rejection-heavy bounds).
func TestPCGIsMathRand(t *testing.T) {
	for _, seed := range []uint64{0, 1, 42, 1 << 63, math.MaxUint64} {
		g, r := pcg{hi: seed}, rand.New(rand.NewPCG(seed, 0))
		for i := range 1000 {
			if a, b := g.uint64(), r.Uint64(); a != b {
				t.Fatalf("seed %d draw %d: %#x, math/rand/v2 %#x", seed, i, a, b)
			}
		}
		for _, n := range []uint64{1, 2, 3, 7, 16, 20, 1000, 1<<40 + 3, 3 << 62, math.MaxUint64} {
			for i := range 200 {
				if a, b := g.intN(n), r.Uint64N(n); a != b {
					t.Fatalf("seed %d n %d draw %d: %d, math/rand/v2 %d", seed, n, i, a, b)
				}
			}
		}
	}
}

// refPairedRatio is PairedRatio's bootstrap written with math/rand/v2
// itself, for the used ratios.
func refPairedRatio(used []float64, seed uint64) (lo, hi float64) {
	r := rand.New(rand.NewPCG(seed, 0))
	means := make([]float64, Resamples)
	s := make([]float64, len(used))
	for b := range means {
		sum := 0.0
		for j := range s {
			s[j] = used[r.IntN(len(used))]
			sum += s[j]
		}
		means[b] = min(max(sum/float64(len(s)), slices.Min(s)), slices.Max(s))
	}
	slices.Sort(means)
	return means[249], means[9749] // the 250th and 9,750th of 10,000
}

// ratioSeries is n seeds of a best and an x = best·ratio, the ratios
// log-normal (so positive) with mean exp(mu + sigma²/2).
func ratioSeries(r *rand.Rand, n int, mu, sigma float64) (x, best []float64) {
	x, best = make([]float64, n), make([]float64, n)
	for i := range x {
		best[i] = 50 + 100*r.Float64()
		x[i] = best[i] * math.Exp(mu+sigma*r.NormFloat64())
	}
	return x, best
}

func TestPairedRatio(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	pow2 := []float64{1, 2, 4, 8, 0.5, 0.25, 16, 32, 1024, 0.125}
	times := func(k float64, v []float64) []float64 {
		out := make([]float64, len(v))
		for i := range v {
			out[i] = k * v[i]
		}
		return out
	}
	varied, _ := ratioSeries(rand.New(rand.NewPCG(5, 5)), 20, 0, 0.5)
	for _, c := range []struct {
		name   string
		x      []float64
		best   []float64
		want   *Interval // nil: only the properties below
		ratios []float64 // nil: not checked
	}{
		{"identical series: exactly [1, 1]", varied, varied, &Interval{1, 1, 1, 20}, nil},
		{"constant ratio 1.1: exactly [1.1, 1.1]", times(1.1, pow2), pow2, &Interval{1.1, 1.1, 1.1, 10}, slices.Repeat([]float64{1.1}, 10)},
		{"one seed: its ratio", []float64{3}, []float64{2}, &Interval{1.5, 1.5, 1.5, 1}, []float64{1.5}},
		{"no seeds", nil, nil, &Interval{nan, nan, nan, 0}, []float64{}},
		{"best 0 skipped and reported", []float64{1, 2, 0, 4}, []float64{1, 0, 0, 4}, &Interval{1, 1, 1, 2}, []float64{1, nan, nan, 1}},
		{"NaN and infinities skipped", []float64{nan, 2, inf, 3, 5}, []float64{1, nan, 1, inf, 5}, &Interval{1, 1, 1, 1}, []float64{nan, nan, nan, nan, 1}},
		{"every seed skipped", []float64{1, 2}, []float64{0, 0}, &Interval{nan, nan, nan, 0}, []float64{nan, nan}},
	} {
		t.Run(c.name, func(t *testing.T) {
			xb, bb := slices.Clone(c.x), slices.Clone(c.best)
			got, ratios := PairedRatio(c.x, c.best, 1)
			if !near(got, *c.want, 0) {
				t.Errorf("interval %+v, want %+v", got, *c.want)
			}
			if c.ratios != nil && !slices.EqualFunc(ratios, c.ratios, func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }) {
				t.Errorf("ratios %v, want %v", ratios, c.ratios)
			}
			if len(ratios) != len(c.x) {
				t.Errorf("%d ratios for %d seeds", len(ratios), len(c.x))
			}
			if !sameBits(xb, c.x) || !sameBits(bb, c.best) {
				t.Error("PairedRatio changed its arguments")
			}
		})
	}
}

// TestPairedRatioIsTheBootstrap: on varied ratios, with seeds skipped,
// the interval is the bootstrap written with math/rand/v2 over the used
// seeds, bit for bit; the mean is the ratios' mean, inside the interval;
// and skipping a seed is the same as leaving it out.
func TestPairedRatioIsTheBootstrap(t *testing.T) {
	x, best := ratioSeries(rand.New(rand.NewPCG(9, 9)), 20, 0.05, 0.2)
	best[3], x[11] = 0, math.NaN()
	for _, seed := range []uint64{0, 1, 77} {
		got, ratios := PairedRatio(x, best, seed)
		var used []float64
		var xs, bs []float64
		for i, r := range ratios {
			if i == 3 || i == 11 {
				if !math.IsNaN(r) {
					t.Errorf("seed %d: ratio %d is %v, not reported skipped", seed, i, r)
				}
				continue
			}
			if r != x[i]/best[i] {
				t.Errorf("seed %d: ratio %d is %v, want %v", seed, i, r, x[i]/best[i])
			}
			used, xs, bs = append(used, r), append(xs, x[i]), append(bs, best[i])
		}
		lo, hi := refPairedRatio(used, seed)
		if want := (Interval{mean(used), lo, hi, 18}); got != want {
			t.Errorf("seed %d: %+v, the math/rand/v2 bootstrap %+v", seed, got, want)
		}
		if !(got.Lo < got.Mean && got.Mean < got.Hi) {
			t.Errorf("seed %d: the mean is not inside its interval: %+v", seed, got)
		}
		if again, _ := PairedRatio(xs, bs, seed); again != got {
			t.Errorf("seed %d: with the skipped seeds left out %+v, with them %+v", seed, again, got)
		}
	}
}

// TestPairedRatioDeterministic: the same seed gives the same bytes; other
// seeds give other intervals.
func TestPairedRatioDeterministic(t *testing.T) {
	x, best := ratioSeries(rand.New(rand.NewPCG(3, 1)), 20, 0, 0.3)
	bytes := func(seed uint64) []uint64 {
		ci, ratios := PairedRatio(x, best, seed)
		out := []uint64{math.Float64bits(ci.Mean), math.Float64bits(ci.Lo), math.Float64bits(ci.Hi), uint64(ci.N)}
		for _, r := range ratios {
			out = append(out, math.Float64bits(r))
		}
		return out
	}
	a := bytes(12345)
	for range 3 {
		if b := bytes(12345); !slices.Equal(a, b) {
			t.Fatalf("seed 12345 twice: %x then %x", a, b)
		}
	}
	if b := bytes(12346); slices.Equal(a[1:3], b[1:3]) {
		t.Errorf("seeds 12345 and 12346 gave the same interval %x", a[1:3])
	}
}

// TestPairedRatioCoverage: for ratios drawn from a known distribution
// (log-normal, mean exp(μ+σ²/2)), 20 seeds at a time, the bootstrap
// interval covers the true mean ratio at a plausible rate. The percentile
// bootstrap runs under 95% at 20 seeds (92.4% over 6,000 trials of this
// shape, where Student's t on the same ratios covers 94.8%); the bounds
// allow that, and the trials' binomial spread (1.3 points at 400).
func TestPairedRatioCoverage(t *testing.T) {
	const trials, seeds, mu, sigma = 400, 20, 0.1, 0.15
	truth := math.Exp(mu + sigma*sigma/2)
	r := rand.New(rand.NewPCG(34, 5))
	covered := 0
	for i := range trials {
		x, best := ratioSeries(r, seeds, mu, sigma)
		if ci, _ := PairedRatio(x, best, uint64(i)); ci.Lo <= truth && truth <= ci.Hi {
			covered++
		}
	}
	rate := float64(covered) / trials
	t.Logf("covered %d of %d (%.1f%%)", covered, trials, 100*rate)
	if rate < 0.88 || rate > 0.97 {
		t.Errorf("coverage %.1f%%, want 88–97%%", 100*rate)
	}
}

func TestPairedRatioPanicsOnLengths(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("series of different lengths did not panic")
		}
	}()
	PairedRatio([]float64{1, 2}, []float64{1}, 1)
}

// BenchmarkPairedRatio: 20 seeds, the lab's usual count.
func BenchmarkPairedRatio(b *testing.B) {
	x, best := ratioSeries(rand.New(rand.NewPCG(1, 1)), 20, 0, 0.2)
	for b.Loop() {
		PairedRatio(x, best, 1)
	}
}

// sameBits reports whether a and b hold the same float64s, bit for bit
// (NaN equal to itself).
func sameBits(a, b []float64) bool {
	return slices.EqualFunc(a, b, func(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) })
}
