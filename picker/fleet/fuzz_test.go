package fleet

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
)

// opReader reads a fuzz input as a sequence of small choices; past its
// end every choice is 0.
type opReader struct {
	b []byte
	i int
}

func (r *opReader) more() bool { return r.i < len(r.b) }

func (r *opReader) next(n int) int {
	if r.i >= len(r.b) {
		return 0
	}
	v := int(r.b[r.i]) % n
	r.i++
	return v
}

// FuzzState runs random sequences of registrations, forgets, load
// reports, snapshots (stepped in interleaved parts), deltas and lookups
// against a small state (3 slots a group, 3 sidecars, 6 URLs, 3 models,
// summaries of foreign parameters now and then). It checks that nothing
// panics, that Match reports exactly the endpoints of the group asked for
// (never one of another group), and that what Endpoints lists is
// consistent.
func FuzzState(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 1, 63, 0, 0, 2, 7, 3, 0, 0, 0, 4, 5, 6, 1, 0, 9, 9, 9})
	f.Add([]byte{0, 0, 255, 0, 0, 0, 0, 3, 0, 0, 0, 1, 3, 1, 0, 0, 0, 1, 0, 2, 0, 6, 0, 0, 5, 3, 3})
	f.Add([]byte("register, snapshot, step, delta, match, forget, and again"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := summary.ForCapacity(64) // 1,024 bits: 16 snapshot words
		cfg := DefaultConfig()
		cfg.Params, cfg.Slots = p, 3
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		foreign := summary.ForCapacity(128)
		sidecars := []string{"s0", "s1", "s2"}
		models := []string{"m0", "m1", "m2"}
		url := func(i int) string { return fmt.Sprintf("http://e%d", i) }
		ident := func(r *opReader) Identity {
			id := Identity{Endpoint: url(r.next(6)), Model: models[r.next(3)], BlockSize: 16,
				KeyFormat: blockkey.FormatV1, SummaryParams: p.String(), Epoch: uint64(r.next(3))}
			if r.next(8) == 0 {
				id.SummaryParams = foreign.String()
			}
			return id
		}
		keys := func(r *opReader) []blockkey.Key {
			ks := make([]blockkey.Key, r.next(12))
			for i := range ks {
				ks[i] = blockkey.Key(uint64(r.next(16)+1) * 0x9e3779b97f4a7c15)
			}
			return ks
		}
		tierOf := func(r *opReader) tier.Tier { return tier.Tier(r.next(tier.Count + 1)) } // one in four invalid
		live := map[string]bool{}
		var loads []*summary.SnapshotLoad
		var groups []string
		now := time.Unix(0, 0)
		r := &opReader{b: data}
		for r.more() {
			now = now.Add(time.Millisecond)
			sc := sidecars[r.next(len(sidecars))]
			switch r.next(9) {
			case 0: // register
				eps := make([]Identity, r.next(5))
				for i := range eps {
					eps[i] = ident(r)
					groups = append(groups, eps[i].Group())
				}
				reg, err := s.Register(sc, eps, func(o string) bool { return live[o] }, time.Time{})
				if err != nil {
					t.Fatal(err)
				}
				for _, pos := range reg.Positions {
					if e := s.endpoints[pos.Endpoint]; e == nil || e.Sidecar != sc || !pos.Tier.Valid() {
						t.Fatalf("position %+v for an endpoint %s does not hold", pos, sc)
					}
				}
				live[sc] = r.next(2) == 0
			case 1: // forget
				s.Forget(sc)
				live[sc] = false
			case 2:
				s.ApplyLoad(sc, url(r.next(6)), Load{Waiting: float64(r.next(9))}, now)
			case 3: // snapshot of some keys
				c := summary.NewCounting(p)
				for _, k := range keys(r) {
					c.Add(k)
				}
				c.TakeDelta()
				snap := c.Snapshot()
				if r.next(10) == 0 {
					snap = summary.NewCounting(foreign).Snapshot()
				}
				l, err := s.StartSnapshot(sc, url(r.next(6)), tierOf(r), uint64(r.next(3)), snap, now)
				if err != nil && FaultOf(err) != Malformed {
					t.Fatalf("snapshot: %v", err)
				}
				if l != nil {
					loads = append(loads, l)
				}
			case 4: // step a pending load
				if len(loads) > 0 {
					i := r.next(len(loads))
					if done, err := loads[i].Step(r.next(8) + 1); done || err != nil {
						loads = append(loads[:i], loads[i+1:]...)
					}
				}
			case 5: // delta
				d := summary.Delta{Seq: uint64(r.next(4))}
				for range r.next(4) {
					d.Flips = append(d.Flips, uint32(r.next(256))*uint32(r.next(6)+1)) // now and then past m
				}
				ok, err := s.ApplyDelta(sc, url(r.next(6)), tierOf(r), uint64(r.next(3)), d, now)
				if (ok && err != nil) || (err != nil && FaultOf(err) == 0) {
					t.Fatalf("delta: %v, %v", ok, err)
				}
			case 6:
				s.Touch(sc, url(r.next(6)), now)
			default: // match
				if len(groups) == 0 {
					continue
				}
				g := groups[r.next(len(groups))]
				got := s.Match(g, tierOf(r), keys(r))
				want := map[string]bool{}
				for _, e := range s.Endpoints() {
					if e.Group == g {
						want[e.URL] = true
					}
				}
				for u, n := range got {
					if !want[u] || n <= 0 {
						t.Fatalf("group %s: matched %s (%d), not of the group (%v)", g, u, n, want)
					}
				}
			}
			perGroup := map[string]int{}
			for _, e := range s.Endpoints() {
				perGroup[e.Group]++
				if e.Group != e.Info.Group() || e.URL != e.Info.Endpoint || e.Info.SummaryParams != p.String() {
					t.Fatalf("endpoint %+v", e)
				}
			}
			for g, n := range perGroup {
				if n > cfg.Slots {
					t.Fatalf("group %s holds %d endpoints, %d slots", g, n, cfg.Slots)
				}
				var filtered []Endpoint
				for _, e := range s.Endpoints() {
					if e.Group == g {
						filtered = append(filtered, e)
					}
				}
				if got := s.GroupEndpoints(g); !reflect.DeepEqual(got, filtered) {
					t.Fatalf("group %s: GroupEndpoints %v, Endpoints filtered %v", g, urls(got), urls(filtered))
				}
			}
			if len(perGroup) != len(s.groups) {
				t.Fatalf("%d groups held, %d with endpoints", len(s.groups), len(perGroup))
			}
		}
	})
}
