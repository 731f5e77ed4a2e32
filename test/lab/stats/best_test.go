package stats

import (
	"math"
	"slices"
	"testing"
)

func TestBestPerSeed(t *testing.T) {
	nan := math.NaN()
	values := map[string][]float64{
		"precise":     {0.70, 0.72, nan, 0.60},
		"prefix-hash": {0.75, 0.56, nan, 0.61},
		"round-robin": {0.34, 0.29, nan, 0.99}, // not a peer below unless listed
		"ttft-a":      {100, 120, 90, nan},
		"ttft-b":      {110, 115, 95, nan},
	}
	for _, c := range []struct {
		name         string
		peers        []string
		higherBetter bool
		want         []float64
	}{
		{"higher is better: the best peer on each seed", []string{"precise", "prefix-hash"}, true, []float64{0.75, 0.72, nan, 0.61}},
		{"a policy that is not a peer is not used", []string{"precise", "prefix-hash"}, true, []float64{0.75, 0.72, nan, 0.61}},
		{"listed, it is", []string{"precise", "prefix-hash", "round-robin"}, true, []float64{0.75, 0.72, nan, 0.99}},
		{"lower is better", []string{"ttft-a", "ttft-b"}, false, []float64{100, 115, 90, nan}},
		{"one peer: its own series", []string{"ttft-b"}, false, []float64{110, 115, 95, nan}},
		{"duplicates are harmless", []string{"ttft-a", "ttft-a", "ttft-b"}, false, []float64{100, 115, 90, nan}},
		{"a peer's NaN is passed over", []string{"precise", "ttft-a"}, false, []float64{0.70, 0.72, 90, 0.60}},
		{"no peers", nil, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := BestPerSeed(values, c.peers, c.higherBetter)
			if !sameBits(got, c.want) || (got == nil) != (c.want == nil) {
				t.Errorf("BestPerSeed(%v, higher %v) = %v, want %v", c.peers, c.higherBetter, got, c.want)
			}
		})
	}
	if !sameBits(values["precise"], []float64{0.70, 0.72, nan, 0.60}) {
		t.Error("BestPerSeed changed its argument")
	}
}

// TestBestPerSeedRatio: the lab's use, each policy against the best of
// its peers seed by seed; the best peer on every seed is at ratio 1.
func TestBestPerSeedRatio(t *testing.T) {
	values := map[string][]float64{
		"a": {100, 200, 300},
		"b": {110, 180, 300},
	}
	best := BestPerSeed(values, []string{"a", "b"}, false) // latencies: lower is better
	if !slices.Equal(best, []float64{100, 180, 300}) {
		t.Fatalf("best %v", best)
	}
	_, ra := PairedRatio(values["a"], best, 1)
	_, rb := PairedRatio(values["b"], best, 1)
	if want := []float64{1, 200.0 / 180, 1}; !slices.Equal(ra, want) {
		t.Errorf("a's ratios %v, want %v", ra, want)
	}
	if want := []float64{1.1, 1, 1}; !slices.Equal(rb, want) {
		t.Errorf("b's ratios %v, want %v", rb, want)
	}
}

func TestBestPerSeedPanics(t *testing.T) {
	for name, values := range map[string]map[string][]float64{
		"missing peer":     {"a": {1}},
		"lengths disagree": {"a": {1, 2}, "b": {1}},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			BestPerSeed(values, []string{"a", "b"}, true)
		})
	}
}
