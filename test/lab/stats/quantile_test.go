package stats

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// benchQuantile is the bench's nearest rank (test/bench/run.go,
// quantiles), copied: the convention Quantile must keep.
func benchQuantile(v []float64, perMille int) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[max(0, (perMille*len(s)+999)/1000-1)]
}

// TestQuantileMatchesBench: for every per-mille and slices of 1 to 40
// values (ties included), Quantile(v, p/1000) is the bench's value.
func TestQuantileMatchesBench(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for n := 1; n <= 40; n++ {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(r.IntN(10)) + r.Float64()*float64(r.IntN(2)) // some ties
		}
		before := slices.Clone(v)
		for p := 0; p <= 1000; p++ {
			if got, want := Quantile(v, float64(p)/1000), benchQuantile(v, p); got != want {
				t.Fatalf("n=%d q=%d‰: got %v, the bench's %v (v=%v)", n, p, got, want, v)
			}
		}
		if !slices.Equal(v, before) {
			t.Fatalf("Quantile changed its argument")
		}
	}
}

func TestQuantile(t *testing.T) {
	nan := math.NaN()
	for _, c := range []struct {
		name string
		v    []float64
		q    float64
		want float64
	}{
		{"median of three", []float64{3, 1, 2}, 0.5, 2},
		{"median of four is the lower middle", []float64{4, 1, 3, 2}, 0.5, 2},
		{"p90 of ten", []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 0.9, 9},
		{"p99 of ten is the max", []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 0.99, 10},
		{"q 0 is the min", []float64{5, 3, 9}, 0, 3},
		{"q 1 is the max", []float64{5, 3, 9}, 1, 9},
		{"q below 0 clamps", []float64{5, 3, 9}, -1, 3},
		{"q above 1 clamps", []float64{5, 3, 9}, 2, 9},
		{"one value", []float64{4}, 0.9, 4},
		{"NaN values excluded", []float64{nan, 3, nan, 1, 2}, 0.5, 2},
		{"0.07 of 100 is rank 7 (not 8: 0.07·100 rounds up in binary)", seq(100), 0.07, 7},
		{"empty", nil, 0.5, nan},
		{"only NaN", []float64{nan}, 0.5, nan},
		{"NaN q", []float64{1}, nan, nan},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Quantile(c.v, c.q)
			if got != c.want && !(math.IsNaN(got) && math.IsNaN(c.want)) {
				t.Errorf("Quantile(%v, %v) = %v, want %v", c.v, c.q, got, c.want)
			}
		})
	}
}

// seq is 1, 2, …, n.
func seq(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(i + 1)
	}
	return out
}
