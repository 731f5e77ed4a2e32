package stats

import (
	"math"
	"slices"
)

// Quantile is the nearest-rank q-quantile of v: on v's values sorted
// ascending, the one of rank ⌈q·n⌉ (1-based; the first when that rank is
// below 1), as the bench's reports compute their percentiles. q is
// clamped to [0, 1]; a product q·n within 1e-12 (relative) of an integer
// is that integer, so that q = 0.07 over 100 values is rank 7 even though
// 0.07 is not exact in binary. NaN values are excluded; with no value
// left, or a NaN q, Quantile is NaN. v is not changed.
func Quantile(v []float64, q float64) float64 {
	s := present(v)
	if len(s) == 0 || math.IsNaN(q) {
		return math.NaN()
	}
	slices.Sort(s)
	return s[rankIndex(len(s), q)]
}

// present is a copy of v without its NaN values, the missing
// measurements (infinities stay).
func present(v []float64) []float64 {
	out := make([]float64, 0, len(v))
	for _, x := range v {
		if !math.IsNaN(x) {
			out = append(out, x)
		}
	}
	return out
}

// rankIndex is the 0-based index of the nearest-rank q-quantile among n
// sorted values (n ≥ 1).
func rankIndex(n int, q float64) int {
	q = min(max(q, 0), 1)
	k := q * float64(n)
	if r := math.Round(k); math.Abs(k-r) <= 1e-12*max(1, r) {
		k = r
	}
	return min(n-1, max(0, int(math.Ceil(k))-1))
}
