package score

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/tier"
)

func gpu(n int) [tier.Count]int { return [tier.Count]int{n, 0, 0} }

func healthy(id string, matched [tier.Count]int, running float64) Candidate {
	return Candidate{ID: id, Healthy: true, Matched: matched, Running: running}
}

// TestDecideRules: one case per rule.
func TestDecideRules(t *testing.T) {
	def := DefaultConfig()
	policy := func(p Policy) *Config { c := DefaultConfig(); c.Policy = p; return &c }
	epsilon := func(e float64) *Config { c := DefaultConfig(); c.Epsilon, c.MinCap = e, 1; return &c }
	// queueing is c with the candidate's engine reporting waiting requests:
	// the bounded-load cap binds only on an engine that queues.
	queueing := func(c Candidate, waiting float64) Candidate { c.Waiting, c.KVUsage = waiting, 0.1; return c }
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
		{"longest match wins", &def, anchored,
			[]Candidate{healthy("a", gpu(1024), 1), healthy("b", gpu(3072), 1), healthy("c", gpu(0), 1)}, "b", ReasonCacheHit, ""},
		{"GPU beats the same prefix on CPU", &def, anchored,
			[]Candidate{healthy("a", [tier.Count]int{0, 2048, 0}, 1), healthy("b", gpu(2048), 1)}, "b", ReasonCacheHit, ""},
		{"CPU tier still beats nothing", &def, anchored,
			[]Candidate{healthy("a", [tier.Count]int{0, 2048, 0}, 1), healthy("b", gpu(0), 1)}, "a", ReasonCacheHit, ""},
		{"a deeper CPU prefix adds to the GPU one", &def, anchored,
			[]Candidate{healthy("a", [tier.Count]int{1024, 3072, 0}, 1), healthy("b", gpu(2048), 1)}, "a", ReasonCacheHit, ""},
		{"queued work outweighs a short match", &def, anchored,
			[]Candidate{{ID: "a", Healthy: true, Matched: gpu(256), Waiting: 2, Running: 2}, healthy("b", gpu(0), 2)}, "b", ReasonCacheHit, ""},
		{"tokens this picker sent count as queued work", &def, anchored,
			[]Candidate{{ID: "a", Healthy: true, Matched: gpu(1024), Sent: 1, SentTokens: 4000}, healthy("b", gpu(512), 0)}, "b", ReasonCacheHit, ""},
		{"the best-cached endpoint at the cap is skipped when its engine queues", epsilon(0), anchored,
			[]Candidate{queueing(healthy("a", gpu(4000), 6), 1), healthy("b", gpu(0), 1), healthy("c", gpu(0), 1)}, order2("b", "c"), ReasonCacheHit, "a"},
		{"the cap does not move a long warm prompt where it would cost over 1.5× the warm estimate", epsilon(0), Request{PromptTokens: 40000, Anchor: 42, HasAnchor: true},
			[]Candidate{queueing(healthy("a", gpu(39000), 6), 1), healthy("b", gpu(0), 1), healthy("c", gpu(0), 1)}, "a", ReasonCacheHit, ""},
		{"the best-cached endpoint at the cap is skipped when its live requests hold half its KV", epsilon(0), anchored,
			[]Candidate{func() Candidate { c := healthy("a", gpu(4000), 6); c.KVUsage = 0.5; return c }(), healthy("b", gpu(0), 1), healthy("c", gpu(0), 1)},
			order2("b", "c"), ReasonCacheHit, "a"},
		{"the best-cached endpoint over the cap keeps the request while its engine has room", epsilon(0), anchored,
			[]Candidate{healthy("a", gpu(4000), 6), healthy("b", gpu(0), 1), healthy("c", gpu(0), 1)}, "a", ReasonCacheHit, ""},
		{"with the gate off (SaturationWaiting 0) the count alone binds", func() *Config { c := epsilon(0); c.SaturationWaiting = 0; return c }(), anchored,
			[]Candidate{healthy("a", gpu(4000), 6), healthy("b", gpu(0), 1), healthy("c", gpu(0), 1)}, order2("b", "c"), ReasonCacheHit, "a"},
		{"at ε=0.25 the same endpoint is within the cap", &def, anchored,
			[]Candidate{healthy("a", gpu(4000), 3), healthy("b", gpu(0), 2), healthy("c", gpu(0), 2)}, "a", ReasonCacheHit, ""},
		{"a match under MinMatchTokens is cold", &def, anchored,
			[]Candidate{healthy("a", gpu(0), 0), healthy("b", gpu(0), 0), healthy("c", gpu(0), 0), healthy("d", gpu(8), 0)}, order[0], ReasonColdAnchor, ""},
		{"cold: rendezvous on the anchor", &def, anchored,
			[]Candidate{healthy("d", gpu(0), 0), healthy("c", gpu(0), 0), healthy("b", gpu(0), 0), healthy("a", gpu(0), 0)}, order[0], ReasonColdAnchor, ""},
		{"cold: the anchor's first choice at the cap gives way to its second", epsilon(0), anchored,
			[]Candidate{{ID: order[0], Healthy: true, Running: 3}, healthy(order[1], gpu(0), 0), healthy(order[2], gpu(0), 1), healthy(order[3], gpu(0), 1)}, order[1], ReasonColdAnchor, ""},
		{"cold without an anchor: least loaded", &def, Request{PromptTokens: 100, TieKey: 7},
			[]Candidate{healthy("a", gpu(0), 3), healthy("b", gpu(0), 1), healthy("c", gpu(0), 2)}, "b", ReasonColdNoAnchor, ""},
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
	cfg.Epsilon = 0.25        // a cap tight enough for the floor to matter
	cfg.SaturationWaiting = 0 // and binding on the count alone
	cfg.OverrideCost = 0      // whatever the move costs
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
		func(c *Config) { c.WaitingTokens = -1 },
		func(c *Config) { c.SaturationWaiting = -1 },
		func(c *Config) { c.SaturationKVUsage = 1.5 },
		func(c *Config) { c.OverrideCost = 0.5 },
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
