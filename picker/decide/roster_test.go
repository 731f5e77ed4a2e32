package decide

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/inflight"
	"github.com/kvroute/kvroute/picker/predict"
	"github.com/kvroute/kvroute/picker/score"
)

// TestLargeGroupReadsAsSmall: over groups of 40 and 100 endpoints (the
// larger one's maps placed by index, not read by URL) whose matches,
// picks in flight and learned factors are many,
// every candidate holds what the snapshot's maps say of its URL, and the
// decision is the same from values (Endpoints), from the roster in URL
// order or in another order, with the factors by index (Factors) or by
// URL (Learned), with P2P told by Sources or by the roster's briefs, and
// in a Scratch every round reuses (groups of both sizes in turn: the
// memory left by another group's decision).
func TestLargeGroupReadsAsSmall(t *testing.T) {
	cfg := DefaultConfig()
	rng := rand.New(rand.NewPCG(8, 8))
	reused := new(Scratch)
	for round := range 200 {
		size := []int{40, 100}[round%2]
		var eps []fleet.Endpoint
		matched := [tier.Count]map[string]int{{}, {}, {}}
		pending := map[string]inflight.Pending{}
		learned := map[string]predict.Endpoint{}
		sources := map[string]bool{}
		for i := range size {
			e := ep(fmt.Sprintf("http://e%03d", i), float64(rng.IntN(4)), float64(rng.IntN(6)), time.Duration(rng.IntN(3000))*time.Millisecond)
			if rng.IntN(3) == 0 {
				e.Info.KVSource = fmt.Sprintf("e%03d:5700", i)
				sources[e.URL] = true
			}
			eps = append(eps, e)
			for _, tr := range tier.All() {
				if rng.IntN(3) == 0 {
					matched[tr][e.URL] = rng.IntN(64)
				}
			}
			if rng.IntN(2) == 0 {
				pending[e.URL] = inflight.Pending{Count: rng.IntN(3), Tokens: float64(rng.IntN(900)), PullsOut: rng.IntN(2)}
			}
			learned[e.URL] = predict.Endpoint{Speed: 0.5 + rng.Float64(), MeanTokens: float64(rng.IntN(800))}
		}
		matched[tier.GPU]["http://elsewhere"] = 9 // not of the group: never read
		req := Request{Request: score.Request{PromptTokens: 1024, Anchor: uint64(round), HasAnchor: true}, BlockSize: 16}
		byValue := Snapshot{Endpoints: eps, Matched: matched, InFlight: pending, Learned: learned, Sources: sources}
		ptrs := make([]*fleet.Endpoint, len(eps))
		for i := range eps {
			ptrs[i] = &eps[i]
		}
		factors := make([]predict.Endpoint, len(eps))
		for i, e := range eps {
			factors[i] = learned[e.URL]
		}
		sorted := Snapshot{Roster: fleet.NewRoster(ptrs), Matched: matched, InFlight: pending, Factors: factors}
		shuffled := slices.Clone(ptrs)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		other := Snapshot{Roster: fleet.NewRoster(shuffled), Matched: matched, InFlight: pending, Learned: learned, Sources: sources}

		cands := Candidates(&cfg, req, sorted, now)
		for i, c := range cands {
			e := eps[i]
			cached := e.HealthAt(now, cfg.Health).State == fleet.Cached
			for _, tr := range tier.All() {
				if want := matched[tr][e.URL] * 16; cached && c.Matched[tr] != want || !cached && c.Matched[tr] != 0 {
					t.Fatalf("round %d, %s: matched %v in tier %v, the map says %d", round, e.URL, c.Matched, tr, want)
				}
			}
			if p := pending[e.URL]; c.Sent != p.Count || c.SentTokens != p.Tokens {
				t.Fatalf("round %d, %s: sent %d (%v tokens), the map says %+v", round, e.URL, c.Sent, c.SentTokens, p)
			}
		}
		if want := Candidates(&cfg, req, byValue, now); !reflect.DeepEqual(cands, want) {
			t.Fatalf("round %d: candidates over the roster differ from those over values", round)
		}
		a, b, c := Decide(&cfg, req, byValue, now), Decide(&cfg, req, sorted, now), Decide(&cfg, req, other, now)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("round %d: by value %s, over the roster %s", round, fields(a), fields(b))
		}
		inScratch := sorted
		inScratch.Scratch = reused
		if s := Decide(&cfg, req, inScratch, now); !reflect.DeepEqual(s, b) {
			t.Fatalf("round %d: in a reused scratch %s, in fresh memory %s", round, fields(s), fields(b))
		}
		// In another order, only what indexes the candidates differs.
		a.Explain, c.Explain = nil, nil
		if a.Override != nil && c.Override != nil {
			a.Override.Index, c.Override.Index = 0, 0
		}
		if !reflect.DeepEqual(a, c) {
			t.Fatalf("round %d: by value %s, over the roster reordered %s", round, fields(a), fields(c))
		}
	}
}

// fields prints a decision's fields (not its String), its explanation
// aside.
func fields(d Decision) string {
	type plain Decision
	d.Explain = nil
	return fmt.Sprintf("%+v (override %+v)", plain(d), d.Override)
}
