package score

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/zeebo/xxh3"
)

// TestIDHashGivenOrNot: a candidate's URL hash given by the caller
// (Candidate.IDHash) decides as hashing its ID here does, for every
// policy.
func TestIDHashGivenOrNot(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	for round := range 300 {
		var cs []Candidate
		for i := range 2 + rng.IntN(30) {
			cs = append(cs, Candidate{ID: fmt.Sprintf("http://e%d:8000", i), Healthy: rng.IntN(8) != 0,
				Matched: [3]int{16 * rng.IntN(40), 16 * rng.IntN(60), 0}, Waiting: float64(rng.IntN(4)), Running: float64(rng.IntN(8)),
				Sent: rng.IntN(3), Predicted: 0.1 + rng.Float64(), Ahead: float64(rng.IntN(2000))})
		}
		hashed := make([]Candidate, len(cs))
		for i, c := range cs {
			c.IDHash = xxh3.HashString(c.ID)
			hashed[i] = c
		}
		r := Request{PromptTokens: 1024, Anchor: rng.Uint64(), HasAnchor: rng.IntN(2) == 0, TieKey: rng.Uint64(), Counter: uint64(round)}
		for _, p := range Policies() {
			cfg := DefaultConfig()
			cfg.Policy = p
			a, b := Decide(&cfg, r, cs), Decide(&cfg, r, hashed)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("round %d, %s: %+v without the hashes, %+v with", round, p, a, b)
			}
		}
	}
}
