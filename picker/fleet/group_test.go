package fleet

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/tier"
)

// TestGroupEndpoints: a group's endpoints only, sorted by URL, copies;
// what Endpoints filtered to the group would return, however the group's
// slots were filled and freed.
func TestGroupEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reg   map[string][]Identity // sidecar → endpoints
		drop  []string              // sidecars forgotten afterwards
		model string                // the group asked for: model m's
		want  []string
	}{
		{name: "empty state", model: "m"},
		{name: "unknown group", reg: map[string][]Identity{"s": {ident("http://a", "n")}}, model: "m"},
		{name: "one group", reg: map[string][]Identity{"s": {ident("http://b", "m"), ident("http://a", "m")}},
			model: "m", want: []string{"http://a", "http://b"}},
		{name: "others left out", reg: map[string][]Identity{
			"s": {ident("http://c", "m"), ident("http://a", "n")},
			"t": {ident("http://b", "m"), ident("http://d", "n")},
		}, model: "m", want: []string{"http://b", "http://c"}},
		{name: "freed slot", reg: map[string][]Identity{
			"s": {ident("http://c", "m")},
			"t": {ident("http://a", "m"), ident("http://b", "m")},
		}, drop: []string{"s"}, model: "m", want: []string{"http://a", "http://b"}},
		{name: "group emptied", reg: map[string][]Identity{"s": {ident("http://a", "m")}, "t": {ident("http://b", "n")}},
			drop: []string{"s"}, model: "m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newState(t, 8)
			for _, sc := range []string{"s", "t"} { // a fixed order: slots depend on it
				if eps := tc.reg[sc]; eps != nil {
					mustRegister(t, s, sc, eps...)
				}
			}
			for _, sc := range tc.drop {
				s.Forget(sc)
			}
			gid := ident("http://x", tc.model).Group()
			got := s.GroupEndpoints(gid)
			if !reflect.DeepEqual(urls(got), tc.want) {
				t.Fatalf("GroupEndpoints = %v, want %v", urls(got), tc.want)
			}
			var filtered []Endpoint
			for _, e := range s.Endpoints() {
				if e.Group == gid {
					filtered = append(filtered, e)
				}
			}
			if len(got) > 0 && !reflect.DeepEqual(got, filtered) {
				t.Errorf("GroupEndpoints = %+v, Endpoints filtered = %+v", got, filtered)
			}
			if len(got) > 0 { // copies: changing them changes nothing held
				got[0].Sidecar = "changed"
				if again := s.GroupEndpoints(gid); again[0].Sidecar == "changed" {
					t.Error("GroupEndpoints returned the state's own entries")
				}
			}
		})
	}
}

// BenchmarkGroupEndpoints: one group's endpoints read with 20 endpoints
// in the fleet (the group alone) and with 1,000 (50 groups of 20). The
// cost must not grow with the fleet (issue 21); whole-fleet-filtered is
// the read it replaced, Endpoints filtered to the group, for comparison.
func BenchmarkGroupEndpoints(b *testing.B) {
	for _, models := range []int{1, 50} {
		b.Run(fmt.Sprintf("fleet=%d", models*20), func(b *testing.B) {
			s := newState(b, 256)
			for m := range models {
				var eps []Identity
				for i := range 20 {
					eps = append(eps, ident(fmt.Sprintf("http://m%d-e%d:8000", m, i), fmt.Sprintf("model-%d", m)))
				}
				if _, err := s.Register(fmt.Sprintf("sidecar-%d", m), eps, nil, time.Time{}); err != nil {
					b.Fatal(err)
				}
			}
			gid := ident("", "model-0").Group()
			b.Run("group", func(b *testing.B) {
				b.ReportAllocs()
				for range b.N {
					if len(s.GroupEndpoints(gid)) != 20 {
						b.Fatal("not the group's 20 endpoints")
					}
				}
			})
			b.Run("whole-fleet-filtered", func(b *testing.B) { // what requests did before issue 21
				b.ReportAllocs()
				for range b.N {
					n := 0
					for _, e := range s.Endpoints() {
						if e.Group == gid {
							n++
						}
					}
					if n != 20 {
						b.Fatal("not the group's 20 endpoints")
					}
				}
			})
		})
	}
}

// TestLargeGroup: one model of 1,000 endpoints, more than the 256 a
// group once held, fits under the default bound; its slots grow as the
// endpoints come; every endpoint's matched length comes back through the
// search; and the group refuses the one past Config.Slots.
func TestLargeGroup(t *testing.T) {
	const n = 1000
	cfg := DefaultConfig()
	cfg.Params = testParams()
	cfg.Slots = n
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Slots > DefaultSlots {
		t.Fatalf("%d endpoints exceed the default bound %d", n, DefaultSlots)
	}
	chain := keys(40, 1<<40)
	gid := ident("", "m").Group()
	grows, slots := 0, 0
	for i := range n {
		sc, url := fmt.Sprintf("s%d", i), fmt.Sprintf("http://e%d:8000", i)
		reg := mustRegister(t, s, sc, ident(url, "m"))
		if len(reg.Refused) > 0 {
			t.Fatalf("endpoint %d refused: %+v", i, reg.Refused)
		}
		snapshot(t, s, sc, url, tier.GPU, 1, summaryOf(chain[:i%41]...))
		if got := s.groups[gid].tiers[tier.GPU].Slots(); got != slots {
			grows, slots = grows+1, got
		}
	}
	// The index grows by half again at least: 64 slots, then 96, 144,
	// …, 1,024 (bounded by Config.Slots, rounded up to a row word), not
	// 64 slots at a time.
	if grows > 8 || slots < n || slots > (n+63)/64*64 {
		t.Fatalf("the index grew %d times, to %d slots, for %d endpoints", grows, slots, n)
	}
	if g := s.groups[gid]; len(g.slots) != n {
		t.Fatalf("%d slots for %d endpoints", len(g.slots), n)
	}
	got := s.Match(gid, tier.GPU, chain)
	if holders := n - (n+40)/41; len(got) < holders { // endpoint i holds i%41 blocks
		t.Fatalf("%d matched lengths for %d endpoints holding a prefix", len(got), holders)
	}
	wrong := 0
	for i := range n {
		if m := got[fmt.Sprintf("http://e%d:8000", i)]; m < i%41 {
			t.Fatalf("endpoint %d matched %d, holds %d", i, m, i%41)
		} else if m != i%41 {
			wrong++ // a false positive can only lengthen a match
		}
	}
	if wrong > n/50 {
		t.Fatalf("%d of %d matches lengthened", wrong, n)
	}
	reg := mustRegister(t, s, "late", ident("http://late:8000", "m"))
	if len(reg.Refused) != 1 || reg.Refused[0].Reason != ReasonGroupFull {
		t.Fatalf("the endpoint past the bound: %+v", reg.Refused)
	}
}
