package stats

import "math"

// Interval is an estimate with its two-sided 95% confidence interval:
// Mean, its bounds Lo and Hi, and N, the number of values it was made
// from (NaN values excluded).
type Interval struct {
	Mean, Lo, Hi float64
	N            int
}

// tTable holds Student's t(0.975, df), the two-sided 95% critical
// values, for df = 1 to 30 (tTable[df-1]), to 12 decimals.
var tTable = [30]float64{
	12.706204736175, 4.302652729749, 3.182446305284, 2.776445105198, 2.570581835636,
	2.446911851145, 2.364624251593, 2.306004135204, 2.262157162798, 2.228138851986,
	2.200985160092, 2.178812829667, 2.160368656463, 2.144786687918, 2.131449545560,
	2.119905299221, 2.109815577833, 2.100922040241, 2.093024054408, 2.085963447266,
	2.079613844728, 2.073873067904, 2.068657610419, 2.063898561628, 2.059538552753,
	2.055529438643, 2.051830516480, 2.048407141795, 2.045229642133, 2.042272456301,
}

// z975 is the standard normal's 0.975 quantile.
const z975 = 1.959963984540054

// TCritical is Student's t(0.975, df), the critical value of a two-sided
// 95% interval with df degrees of freedom: from a table for df 1 to 30,
// beyond from the Cornish–Fisher expansion about the normal (Abramowitz
// and Stegun 26.7.5, terms to 1/df⁴), within 3e-8 of the exact value. It
// is NaN for df < 1.
func TCritical(df int) float64 {
	switch {
	case df < 1:
		return math.NaN()
	case df <= len(tTable):
		return tTable[df-1]
	}
	z, v := z975, float64(df)
	z2 := z * z
	g1 := (z2 + 1) * z / 4
	g2 := ((5*z2+16)*z2 + 3) * z / 96
	g3 := (((3*z2+19)*z2+17)*z2 - 15) * z / 384
	g4 := ((((79*z2+776)*z2+1482)*z2-1920)*z2 - 945) * z / 92160
	return z + (g1+(g2+(g3+g4/v)/v)/v)/v
}

// MeanCI is the mean of xs with its two-sided 95% confidence interval by
// Student's t: Mean ± TCritical(N−1)·s/√N, s the sample standard
// deviation (divisor N−1). NaN values are excluded (N counts the others).
// With one value, Lo = Hi = Mean: a single value estimates no spread, and
// the zero-width interval is no claim of certainty. With none, Mean, Lo
// and Hi are NaN. xs is not changed.
func MeanCI(xs []float64) Interval {
	s := present(xs)
	n := len(s)
	if n == 0 {
		return Interval{Mean: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	}
	m := mean(s)
	if n == 1 {
		return Interval{Mean: m, Lo: m, Hi: m, N: 1}
	}
	ss := 0.0
	for _, x := range s {
		ss += (x - m) * (x - m)
	}
	half := TCritical(n-1) * math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	return Interval{Mean: m, Lo: m - half, Hi: m + half, N: n}
}

// mean is the mean of s (non-empty, no NaN): the sum over the count,
// corrected once by the mean of the residuals, and clamped to s's range
// so that rounding never puts it outside (a constant series has its
// constant as its mean, exactly).
func mean(s []float64) float64 {
	lo, hi, sum := s[0], s[0], 0.0
	for _, x := range s {
		lo, hi, sum = min(lo, x), max(hi, x), sum+x
	}
	n := float64(len(s))
	m := sum / n
	if !math.IsInf(m, 0) && !math.IsNaN(m) {
		r := 0.0
		for _, x := range s {
			r += x - m
		}
		m += r / n
	}
	return min(max(m, lo), hi)
}
