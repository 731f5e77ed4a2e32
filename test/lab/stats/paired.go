package stats

import (
	"math"
	"math/bits"
	"slices"
)

// Resamples is the number of bootstrap resamples PairedRatio draws.
const Resamples = 10000

// PairedRatio compares two series aligned by seed: ratios[i] is
// x[i]/best[i], and the Interval is the mean of the ratios with a
// bootstrap 95% percentile interval (Resamples resamples of the seeds
// with replacement, drawn from math/rand/v2's PCG seeded with (seed, 0);
// Lo and Hi are the nearest-rank 2.5% and 97.5% quantiles of the
// resamples' means). A seed whose ratio is not a finite number (best[i]
// is 0, or either value is NaN or infinite) is skipped and reported:
// its ratio is NaN, and Interval.N counts only the seeds used. With no
// seed used, Mean, Lo and Hi are NaN; with one, all three are its ratio.
// The result depends on the inputs and seed only, bit for bit. x and
// best are not changed; PairedRatio panics if their lengths differ.
func PairedRatio(x, best []float64, seed uint64) (Interval, []float64) {
	if len(x) != len(best) {
		panic("stats: PairedRatio of series of different lengths")
	}
	ratios := make([]float64, len(x))
	used := make([]float64, 0, len(x))
	for i := range x {
		r := x[i] / best[i]
		if math.IsNaN(r) || math.IsInf(r, 0) || best[i] == 0 || math.IsInf(best[i], 0) {
			ratios[i] = math.NaN()
			continue
		}
		ratios[i] = r
		used = append(used, r)
	}
	m := len(used)
	if m == 0 {
		return Interval{Mean: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}, ratios
	}
	means := make([]float64, Resamples)
	g := pcg{hi: seed}
	for b := range means {
		means[b] = resampleMean(used, &g)
	}
	slices.Sort(means)
	return Interval{
		Mean: mean(used),
		Lo:   means[rankIndex(Resamples, 0.025)],
		Hi:   means[rankIndex(Resamples, 0.975)],
		N:    m,
	}, ratios
}

// resampleMean draws len(used) of used with replacement, from g, and is
// their mean: the sum over the count, clamped to the range of the drawn
// values (so a constant series resamples to its constant, exactly).
func resampleMean(used []float64, g *pcg) float64 {
	n := uint64(len(used))
	x := used[g.intN(n)]
	sum, lo, hi := x, x, x
	for range n - 1 {
		x = used[g.intN(n)]
		sum += x
		if x < lo {
			lo = x
		} else if x > hi {
			hi = x
		}
	}
	m := sum / float64(n)
	if m < lo {
		return lo
	}
	if m > hi {
		return hi
	}
	return m
}

// pcg is math/rand/v2's PCG (128-bit LCG state, DXSM output): a copy, as
// a core imports no randomness package; the tests check it against
// math/rand/v2 draw for draw. pcg{hi: a, lo: b} is rand.NewPCG(a, b).
type pcg struct{ hi, lo uint64 }

// uint64 is PCG.Uint64.
func (p *pcg) uint64() uint64 {
	const (
		mulHi    = 2549297995355413924
		mulLo    = 4865540595714422341
		incHi    = 6364136223846793005
		incLo    = 1442695040888963407
		cheapMul = 0xda942042e4dd58b5
	)
	hi, lo := bits.Mul64(p.lo, mulLo)
	hi += p.hi*mulLo + p.lo*mulHi
	lo, c := bits.Add64(lo, incLo, 0)
	hi, _ = bits.Add64(hi, incHi, c)
	p.lo, p.hi = lo, hi
	hi ^= hi >> 32
	hi *= cheapMul
	hi ^= hi >> 48
	hi *= lo | 1
	return hi
}

// intN is Rand.IntN over the PCG, for n ≥ 1: a power of two masks one
// draw (n = 1 too, which still draws), otherwise Lemire's multiply with
// rejection, as math/rand/v2 does on every platform.
func (p *pcg) intN(n uint64) uint64 {
	if n&(n-1) == 0 {
		return p.uint64() & (n - 1)
	}
	hi, lo := bits.Mul64(p.uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(p.uint64(), n)
		}
	}
	return hi
}
