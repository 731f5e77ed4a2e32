package score

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/tier"
)

func gpu(n int) [tier.Count]int { return [tier.Count]int{n, 0, 0} }

// pred is c with its predicted TTFT.
func pred(c Candidate, seconds float64) Candidate { c.Predicted = seconds; return c }

func healthy(id string, matched [tier.Count]int, running float64) Candidate {
	return Candidate{ID: id, Healthy: true, Matched: matched, Running: running}
}

// TestDecideRules: one case per rule.
func TestDecideRules(t *testing.T) {
	def := DefaultConfig()
	policy := func(p Policy) *Config { c := DefaultConfig(); c.Policy = p; return &c }
	epsilon := func(e float64) *Config { c := DefaultConfig(); c.Epsilon, c.MinCap = e, 1; return &c }
	def.MinCap = 1 // the formula alone; TestMinCap covers the floor
	anchored := Request{PromptTokens: 4096, Anchor: 42, HasAnchor: true}
	// The anchor's rendezvous order over a, b, c, d.
	order := []string{"a", "b", "c", "d"}
	slices.SortFunc(order, func(x, y string) int {
		if Weight(42, x) > Weight(42, y) {
			return -1
		}
		return 1
	})
	for _, tc := range []struct {
		name     string
		cfg      *Config
		req      Request
		cs       []Candidate
		want     string
		reason   Reason
		override string
	}{
		{"the lowest predicted TTFT wins", &def, anchored,
			[]Candidate{pred(healthy("a", gpu(1024), 1), 0.5), pred(healthy("b", gpu(3072), 1), 0.3), pred(healthy("c", gpu(0), 1), 0.8)}, "b", ReasonCacheHit, ""},
		{"a faster cold endpoint beats a slow warm one; the skipped cache is recorded", &def, anchored,
			[]Candidate{pred(healthy("a", gpu(4000), 1), 2.0), pred(healthy("b", gpu(0), 1), 0.5)}, "b", ReasonColdAnchor, "a"},
		{"within TieRatio of the fastest, the one holding most of the prefix", &def, anchored,
			[]Candidate{pred(healthy("a", gpu(0), 0), 1.0), pred(healthy("b", gpu(2048), 0), 1.2), pred(healthy("c", gpu(4000), 0), 1.3)}, "b", ReasonCacheHit, "c"},
		{"within TieRatio of the fastest, the anchor's rendezvous breaks the tie", &def, anchored,
			[]Candidate{pred(healthy(order[1], gpu(0), 0), 1.0), pred(healthy(order[0], gpu(0), 0), 1.09), pred(healthy(order[2], gpu(0), 0), 1.2)}, order[0], ReasonColdAnchor, ""},
		{"beyond TieRatio the fastest wins", &def, anchored,
			[]Candidate{pred(healthy(order[1], gpu(0), 0), 1.0), pred(healthy(order[0], gpu(0), 0), 1.3)}, order[1], ReasonColdAnchor, ""},
		{"with TieRatio 0 only equal predictions tie", func() *Config { c := DefaultConfig(); c.TieRatio = 0; return &c }(), anchored,
			[]Candidate{pred(healthy(order[1], gpu(0), 0), 1.0), pred(healthy(order[0], gpu(0), 0), 1.01)}, order[1], ReasonColdAnchor, ""},
		{"with an SLO, the most cached of those predicted within it", &def, Request{PromptTokens: 4096, Anchor: 42, HasAnchor: true, SLO: 1},
			[]Candidate{pred(healthy("a", gpu(4000), 1), 0.9), pred(healthy("b", gpu(1024), 0), 0.2), pred(healthy("c", gpu(4000), 0), 1.5)}, "a", ReasonWithinSLO, ""},
		{"with an SLO none meets, the fastest", &def, Request{PromptTokens: 4096, Anchor: 42, HasAnchor: true, SLO: 1},
			[]Candidate{pred(healthy("a", gpu(4000), 1), 2.0), pred(healthy("b", gpu(1024), 0), 1.5)}, "b", ReasonCacheHit, "a"},
		{"the cap is a safety net: the fastest over it is skipped", epsilon(0), anchored,
			[]Candidate{pred(healthy("a", gpu(4000), 6), 0.1), pred(healthy("b", gpu(0), 1), 0.5), pred(healthy("c", gpu(0), 1), 0.7)}, "b", ReasonColdAnchor, "a"},
		{"a match under MinMatchTokens is cold", &def, anchored,
			[]Candidate{healthy("a", gpu(0), 0), healthy("b", gpu(0), 0), healthy("c", gpu(0), 0), healthy("d", gpu(8), 0)}, order[0], ReasonColdAnchor, ""},
		{"cold and predicted alike: rendezvous on the anchor", &def, anchored,
			[]Candidate{healthy("d", gpu(0), 0), healthy("c", gpu(0), 0), healthy("b", gpu(0), 0), healthy("a", gpu(0), 0)}, order[0], ReasonColdAnchor, ""},
		{"cold: the anchor's first choice at the cap gives way to its second", epsilon(0), anchored,
			[]Candidate{{ID: order[0], Healthy: true, Running: 3}, healthy(order[1], gpu(0), 0), healthy(order[2], gpu(0), 1), healthy(order[3], gpu(0), 1)}, order[1], ReasonColdAnchor, ""},
		{"cold without an anchor: the fastest", &def, Request{PromptTokens: 100, TieKey: 7},
			[]Candidate{pred(healthy("a", gpu(0), 3), 3), pred(healthy("b", gpu(0), 1), 1), pred(healthy("c", gpu(0), 2), 2)}, "b", ReasonColdNoAnchor, ""},
		{"unhealthy endpoints are never chosen", &def, anchored,
			[]Candidate{{ID: "a", Matched: gpu(4096)}, healthy("b", gpu(0), 5)}, "b", ReasonColdAnchor, ""},
		{"none healthy", &def, anchored, []Candidate{{ID: "a"}}, "", ReasonNoneHealthy, ""},
		{"load-only ignores the cache", &def, Request{PromptTokens: 4096, Anchor: 42, HasAnchor: true, LoadOnly: true},
			[]Candidate{healthy("a", gpu(4096), 2), healthy("b", gpu(0), 1)}, "b", ReasonLoadOnly, ""},
		{"least-loaded baseline", policy(LeastLoaded), anchored,
			[]Candidate{healthy("a", gpu(4096), 2), healthy("b", gpu(0), 1)}, "b", ReasonLeastLoaded, ""},
		{"prefix-hash baseline ignores matches", policy(PrefixHash), anchored,
			[]Candidate{healthy(order[3], gpu(4096), 0), healthy(order[0], gpu(0), 0)}, order[0], ReasonPrefixHash, ""},
		{"prefix-hash without an anchor is least-loaded", policy(PrefixHash), Request{PromptTokens: 10},
			[]Candidate{healthy("a", gpu(0), 2), healthy("b", gpu(0), 1)}, "b", ReasonLeastLoaded, ""},
		{"round-robin by ID order", policy(RoundRobin), Request{Counter: 5},
			[]Candidate{healthy("c", gpu(0), 0), healthy("a", gpu(0), 0), healthy("b", gpu(0), 0)}, "c", ReasonRoundRobin, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.cfg, tc.req, tc.cs)
			got := ""
			if d.Index >= 0 {
				got = tc.cs[d.Index].ID
			}
			if got != tc.want || d.Reason != tc.reason {
				t.Fatalf("chose %q (%s), want %q (%s); explain %+v", got, d.Reason, tc.want, tc.reason, d.Explain)
			}
			over := ""
			if d.Override != nil {
				over = tc.cs[d.Override.Index].ID
				if d.Override.TokensLost <= 0 {
					t.Fatalf("override lost %v tokens", d.Override.TokensLost)
				}
			}
			if over != tc.override {
				t.Fatalf("override %q, want %q", over, tc.override)
			}
			for i, e := range d.Explain {
				if e.ID != tc.cs[i].ID || e.Why == "" {
					t.Fatalf("explain[%d] = %+v", i, e)
				}
			}
		})
	}
}

// order2 is whichever of x, y the anchor 42 ranks first.
func order2(x, y string) string {
	if Weight(42, x) > Weight(42, y) {
		return x
	}
	return y
}

// TestBoundedLoadCap: the cap is ⌈(1+ε)·mean⌉ counting the new request,
// and no candidate above it is chosen while one is under it, whatever the
// matches — checked on random fleets.
func TestBoundedLoadCap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cfg := DefaultConfig()
	for range 2000 {
		n := 1 + rng.IntN(8)
		cs := make([]Candidate, n)
		total := 0.0
		for i := range cs {
			cs[i] = Candidate{ID: fmt.Sprint("e", i), Healthy: true, Matched: gpu(rng.IntN(4) * 512), Running: float64(rng.IntN(10))}
			total += cs[i].Running
		}
		d := Decide(&cfg, Request{PromptTokens: 2048, Anchor: rng.Uint64(), HasAnchor: rng.IntN(2) == 0}, cs)
		wantCap := max(cfg.MinCap, int(ceil((1+cfg.Epsilon)*(total+1)/float64(n))))
		if d.Cap != wantCap {
			t.Fatalf("cap %d, want %d", d.Cap, wantCap)
		}
		if cs[d.Index].Running+1 > float64(d.Cap) {
			t.Fatalf("chose %v at %v in flight over the cap %d", cs[d.Index].ID, cs[d.Index].Running, d.Cap)
		}
	}
}

// TestMinCap: at low load the floor keeps a conversation on its warm
// endpoint although the picker still counts its previous turn in flight.
func TestMinCap(t *testing.T) {
	cs := []Candidate{{ID: "warm", Healthy: true, Matched: gpu(960), Sent: 1, SentTokens: 40}, healthy("b", gpu(0), 0), healthy("c", gpu(0), 0)}
	r := Request{PromptTokens: 1000, Anchor: 1, HasAnchor: true}
	cfg := DefaultConfig()
	cfg.Epsilon = 0.25 // a cap tight enough for the floor to matter
	cs[0].Predicted, cs[1].Predicted, cs[2].Predicted = 0.1, 0.5, 0.5
	if d := Decide(&cfg, r, cs); cs[d.Index].ID != "warm" || d.Cap != 4 {
		t.Fatalf("with the floor: chose %s, cap %d", cs[d.Index].ID, d.Cap)
	}
	cfg.MinCap = 1
	if d := Decide(&cfg, r, cs); cs[d.Index].ID == "warm" || d.Override == nil {
		t.Fatalf("without the floor the formula's cap of 1 must skip warm: chose %s", cs[d.Index].ID)
	}
}

func ceil(x float64) float64 {
	c := float64(int(x))
	if c < x {
		c++
	}
	return c
}

// TestReplicasAgree: two independent deciders given the same state in a
// different order make the same choice.
func TestReplicasAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, p := range Policies() {
		cfg := DefaultConfig()
		cfg.Policy = p
		for range 500 {
			n := 1 + rng.IntN(8)
			cs := make([]Candidate, n)
			for i := range cs {
				cs[i] = Candidate{ID: fmt.Sprintf("http://10.0.0.%d:8000", i), Healthy: rng.IntN(8) > 0,
					Matched: [tier.Count]int{rng.IntN(3) * 512, rng.IntN(3) * 512, 0}, Running: float64(rng.IntN(4)), Waiting: float64(rng.IntN(2))}
			}
			r := Request{PromptTokens: 2048, Anchor: rng.Uint64(), HasAnchor: rng.IntN(3) > 0, TieKey: rng.Uint64(), Counter: rng.Uint64()}
			a := Decide(&cfg, r, cs)
			shuffled := slices.Clone(cs)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			b := Decide(&cfg, r, shuffled)
			if (a.Index < 0) != (b.Index < 0) || (a.Index >= 0 && cs[a.Index].ID != shuffled[b.Index].ID) || a.Reason != b.Reason {
				t.Fatalf("%s: replicas disagree: %+v vs %+v", p, a, b)
			}
		}
	}
}

// TestColdSiblingsColocate: requests sharing an anchor land on one
// endpoint while it is under the cap, and removing another endpoint does
// not move them (rendezvous hashing).
func TestColdSiblingsColocate(t *testing.T) {
	cfg := DefaultConfig()
	cs := []Candidate{healthy("a", gpu(0), 0), healthy("b", gpu(0), 0), healthy("c", gpu(0), 0), healthy("d", gpu(0), 0)}
	for anchor := uint64(0); anchor < 200; anchor++ {
		r := Request{PromptTokens: 1000, Anchor: anchor, HasAnchor: true}
		first := cs[Decide(&cfg, r, cs).Index].ID
		var others []Candidate
		for _, c := range cs {
			if c.ID != first {
				others = append(others, c)
			}
		}
		rest := []Candidate{others[2], cs[slices.IndexFunc(cs, func(c Candidate) bool { return c.ID == first })]} // two others left
		if got := rest[Decide(&cfg, r, rest).Index].ID; got != first {
			t.Fatalf("anchor %d moved from %s to %s when other endpoints left", anchor, first, got)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := DefaultConfig()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, mod := range []func(*Config){
		func(c *Config) { c.Policy = "random" },
		func(c *Config) { c.Epsilon = -1 },
		func(c *Config) { c.MinMatchTokens = 0 },
		func(c *Config) { c.MinCap = 0 },
		func(c *Config) { c.TierWeights[tier.CPU] = 2 },
		func(c *Config) { c.TieRatio = -0.1 },
		func(c *Config) { c.TieRatio = 11 },
	} {
		c := DefaultConfig()
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("accepted %+v", c)
		}
	}
	if _, err := ParsePolicy("precise"); err != nil {
		t.Fatal(err)
	}
}

// TestLeastLoadedTiesIgnoreThePrefix: the load-only baseline breaks ties by
// the request count, so one prefix does not stick to one endpoint.
func TestLeastLoadedTiesIgnoreThePrefix(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = LeastLoaded
	cs := []Candidate{healthy("a", gpu(0), 0), healthy("b", gpu(0), 0)}
	seen := map[string]bool{}
	for n := uint64(0); n < 32; n++ {
		seen[cs[Decide(&cfg, Request{PromptTokens: 10, Anchor: 42, HasAnchor: true, Counter: n}, cs).Index].ID] = true
	}
	if len(seen) != 2 {
		t.Fatalf("one prefix always went to %v", seen)
	}
}

func TestParsePolicy(t *testing.T) {
	for _, p := range append(Policies(), PeerPolicies()...) {
		if got, err := ParsePolicy(string(p)); err != nil || got != p {
			t.Errorf("%s: %v %v", p, got, err)
		}
		if p.IsPeer() != slices.Contains(PeerPolicies(), p) {
			t.Errorf("%s: IsPeer %v", p, p.IsPeer())
		}
	}
	if _, err := ParsePolicy("llmd"); err == nil {
		t.Error("a misspelt policy accepted")
	}
}
