package stats

import (
	"math"
	"math/rand/v2"
	"testing"
)

// absT is P(|T| ≤ t) for Student's t with nu (integer) degrees of
// freedom, in closed form (Abramowitz and Stegun 26.7.3 and 26.7.4): an
// exact reference independent of the table and the expansion.
func absT(t float64, nu int) float64 {
	th := math.Atan(t / math.Sqrt(float64(nu)))
	s, c := math.Sincos(th)
	if nu%2 == 1 {
		sum := 0.0
		if nu > 1 {
			term := c
			sum = c
			for k := 3; k <= nu-2; k += 2 {
				term *= c * c * float64(k-1) / float64(k)
				sum += term
			}
		}
		return 2 / math.Pi * (th + s*sum)
	}
	term, sum := 1.0, 1.0
	for k := 2; k <= nu-2; k += 2 {
		term *= c * c * float64(k-1) / float64(k)
		sum += term
	}
	return s * sum
}

// exactT is t(0.975, nu) by bisection on absT.
func exactT(nu int) float64 {
	lo, hi := 0.0, 100.0
	for range 200 {
		m := (lo + hi) / 2
		if absT(m, nu) < 0.95 {
			lo = m
		} else {
			hi = m
		}
	}
	return lo
}

// TestTCritical: the table is exact to 1e-11 (df 1–30), the expansion
// beyond within 3e-8, the values fall with df toward the normal's, and
// the textbook values hold to their printed digits.
func TestTCritical(t *testing.T) {
	for df := 1; df <= 1000; df++ {
		tol := 3e-8
		if df <= 30 {
			tol = 1e-11
		}
		if got, want := TCritical(df), exactT(df); math.Abs(got-want) > tol {
			t.Errorf("TCritical(%d) = %.12f, exact %.12f", df, got, want)
		}
		if df > 1 && !(TCritical(df) < TCritical(df-1)) {
			t.Errorf("TCritical(%d) = %v is not below TCritical(%d) = %v", df, TCritical(df), df-1, TCritical(df-1))
		}
	}
	for df, want := range map[int]float64{1: 12.706, 2: 4.303, 4: 2.776, 10: 2.228, 19: 2.093, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980} {
		if got := TCritical(df); math.Abs(got-want) > 0.0005 {
			t.Errorf("TCritical(%d) = %v, tables print %v", df, got, want)
		}
	}
	if got := TCritical(1_000_000); math.Abs(got-z975) > 1e-5 {
		t.Errorf("TCritical(1e6) = %v, not the normal's %v", got, z975)
	}
	for _, df := range []int{0, -1} {
		if !math.IsNaN(TCritical(df)) {
			t.Errorf("TCritical(%d) = %v, want NaN", df, TCritical(df))
		}
	}
}

// TestMeanCI on samples computed by hand.
func TestMeanCI(t *testing.T) {
	nan := math.NaN()
	five := 2.776445105198 * math.Sqrt(2.5) / math.Sqrt(5) // t(0.975,4)·s/√n, s² = 10/4
	thirtyOne := make([]float64, 31)                       // 0..30: mean 15, s² = 31·32/12 = 82.67, df 30
	for i := range thirtyOne {
		thirtyOne[i] = float64(i)
	}
	h31 := 2.042272456301 * math.Sqrt(31.0*32/12) / math.Sqrt(31)
	thirtyTwo := append(append([]float64{}, thirtyOne...), 31) // 0..31: mean 15.5, s² = 32·33/12 = 88, df 31
	h32 := TCritical(31) * math.Sqrt(88) / math.Sqrt(32)
	for _, c := range []struct {
		name string
		xs   []float64
		want Interval
	}{
		{"1..5", []float64{1, 2, 3, 4, 5}, Interval{3, 3 - five, 3 + five, 5}},
		{"1..5 shuffled", []float64{4, 1, 5, 3, 2}, Interval{3, 3 - five, 3 + five, 5}},
		{"1..5 with NaNs excluded", []float64{1, nan, 2, 3, nan, 4, 5}, Interval{3, 3 - five, 3 + five, 5}},
		{"two values, df 1", []float64{2, 4}, Interval{3, 3 - 12.706204736175, 3 + 12.706204736175, 2}}, // s = √2, s/√2 = 1
		{"0..30, df 30 from the table", thirtyOne, Interval{15, 15 - h31, 15 + h31, 31}},
		{"0..31, df 31 from the expansion", thirtyTwo, Interval{15.5, 15.5 - h32, 15.5 + h32, 32}},
		{"one value: Lo = Hi = Mean", []float64{7.25}, Interval{7.25, 7.25, 7.25, 1}},
		{"constant: exact, zero width", []float64{0.1, 0.1, 0.1}, Interval{0.1, 0.1, 0.1, 3}},
		{"none", nil, Interval{nan, nan, nan, 0}},
		{"only NaN", []float64{nan, nan}, Interval{nan, nan, nan, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := MeanCI(c.xs)
			if !near(got, c.want, 1e-12) {
				t.Errorf("MeanCI(%v) = %+v, want %+v", c.xs, got, c.want)
			}
		})
	}
	// The textbook figure: 3 ± 1.9632.
	if got := MeanCI([]float64{1, 2, 3, 4, 5}); math.Abs(got.Hi-got.Mean-1.9632) > 1e-4 {
		t.Errorf("1..5: half-width %v, by hand 2.776·√2.5/√5 = 1.9632", got.Hi-got.Mean)
	}
	// Exactness where it is claimed.
	if got := MeanCI([]float64{0.1, 0.1, 0.1}); got.Mean != 0.1 || got.Lo != 0.1 || got.Hi != 0.1 {
		t.Errorf("constant 0.1: %+v, want exactly 0.1", got)
	}
}

// near compares intervals: N exactly, the rest within tol (relative to
// the magnitude, absolute below 1), NaN equal to NaN.
func near(a, b Interval, tol float64) bool {
	eq := func(x, y float64) bool {
		if math.IsNaN(x) || math.IsNaN(y) {
			return math.IsNaN(x) && math.IsNaN(y)
		}
		return math.Abs(x-y) <= tol*max(1, math.Abs(y))
	}
	return a.N == b.N && eq(a.Mean, b.Mean) && eq(a.Lo, b.Lo) && eq(a.Hi, b.Hi)
}

// TestMeanCICoverage: over 2,000 samples of 20 from a normal of known
// mean (a fixed generator, so a fixed count), the interval covers the
// mean in 93–97% of them.
func TestMeanCICoverage(t *testing.T) {
	const draws, n, mu, sigma = 2000, 20, 10.0, 3.0
	r := rand.New(rand.NewPCG(2026, 34))
	covered := 0
	xs := make([]float64, n)
	for range draws {
		for i := range xs {
			xs[i] = mu + sigma*r.NormFloat64()
		}
		if ci := MeanCI(xs); ci.Lo <= mu && mu <= ci.Hi {
			covered++
		}
	}
	rate := float64(covered) / draws
	t.Logf("covered %d of %d (%.2f%%)", covered, draws, 100*rate)
	if rate < 0.93 || rate > 0.97 {
		t.Errorf("coverage %.2f%%, want 93–97%%", 100*rate)
	}
}
