package stats

import "math"

// BestPerSeed is, for each seed i, the best value among the peers on that
// seed: the highest values[p][i] over p in peers if higherBetter, else
// the lowest. Each policy's ratio to the best peer, seed by seed, is then
// PairedRatio(values[policy], BestPerSeed(values, peers, higherBetter),
// seed). A NaN is a peer's missing value on that seed and is passed
// over; a seed on which no peer has a value is NaN. The caller decides
// whether a policy is among its own peers. With no peers the result is
// nil. values is not changed; BestPerSeed panics if a peer has no series
// in values or the peers' series differ in length.
func BestPerSeed(values map[string][]float64, peers []string, higherBetter bool) []float64 {
	if len(peers) == 0 {
		return nil
	}
	n := -1
	for _, p := range peers {
		v, ok := values[p]
		switch {
		case !ok:
			panic("stats: BestPerSeed: peer " + p + " has no values")
		case n >= 0 && len(v) != n:
			panic("stats: BestPerSeed: peer " + p + "'s series differs in length from the other peers'")
		}
		n = len(v)
	}
	out := make([]float64, n)
	for i := range out {
		b := math.NaN()
		for _, p := range peers {
			x := values[p][i]
			if math.IsNaN(x) {
				continue
			}
			if math.IsNaN(b) || higherBetter && x > b || !higherBetter && x < b {
				b = x
			}
		}
		out[i] = b
	}
	return out
}
