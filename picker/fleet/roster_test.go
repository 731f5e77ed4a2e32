package fleet

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
)

// values copies a roster's endpoints out, to compare with what the state
// holds and to check later that the roster never changed.
func values(r *Roster) []Endpoint {
	if r == nil {
		return nil
	}
	out := make([]Endpoint, len(r.Endpoints))
	for i, e := range r.Endpoints {
		out[i] = *e
	}
	return out
}

// TestRosterFollowsEveryChange: after every kind of change the state
// records (registrations, forgets, load reports, updates heard, a lost
// sidecar and its engine's probe, ejections and readmissions, lags, the
// judge dropping endpoints), the group's roster is exactly what
// GroupEndpoints copies out; a roster read before a change is never
// modified by it; a read with nothing changed returns the same roster;
// and a new roster shares the copies of the endpoints the change was
// not about.
func TestRosterFollowsEveryChange(t *testing.T) {
	s := newState(t, 8)
	c := DefaultHealthConfig()
	rng := rand.New(rand.NewPCG(5, 6))
	sidecars := []string{"s0", "s1", "s2"}
	url := func(i int) string { return fmt.Sprintf("http://e%d", i) }
	groups := []string{ident("", "m0").Group(), ident("", "m1").Group()}
	type kept struct {
		r    *Roster
		vals []Endpoint
	}
	var old []kept
	now := time.Unix(100, 0)
	for step := range 1500 {
		now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
		sc, u := sidecars[rng.IntN(len(sidecars))], url(rng.IntN(8))
		op := rng.IntN(12)
		target := "" // the one endpoint the op may change, when it is one
		switch op {
		case 2, 3, 5, 6, 7, 8, 10:
			target = u
		}
		switch op {
		case 0:
			var ids []Identity
			for range rng.IntN(4) {
				ids = append(ids, ident(url(rng.IntN(8)), fmt.Sprintf("m%d", rng.IntN(2))))
			}
			if _, err := s.Register(sc, ids, nil, now); err != nil {
				t.Fatal(err)
			}
		case 1:
			if rng.IntN(4) == 0 {
				s.Forget(sc)
			}
		case 2:
			s.ApplyLoad(sc, u, Load{Waiting: float64(rng.IntN(5)), StreamState: []string{"", StreamLive, StreamSilent}[rng.IntN(3)]}, now)
		case 3:
			s.Touch(sc, u, now)
		case 4:
			s.LoseSidecar(sc, now)
		case 5:
			s.EngineAnswered(u, rng.IntN(2) == 0)
		case 6:
			s.Failed(u, now, "refused", c)
		case 7:
			s.Probed(u, rng.IntN(2) == 0, now, "probe failed", c)
		case 8:
			s.RecordLag(u, time.Duration(rng.IntN(100))*time.Millisecond)
		case 9:
			s.Judge(now, c)
		case 10:
			_, _ = s.ApplyDelta(sc, u, tier.GPU, 1, summary.Delta{Seq: 1}, now) // heard, then a resync
		default: // reads change nothing
			_ = s.Match(groups[0], tier.GPU, keys(3, 1))
			_ = s.Endpoints()
		}
		for _, g := range groups {
			before := s.groups[g]
			var prev *Roster
			if before != nil {
				prev = before.roster
			}
			r := s.Roster(g)
			if got, want := values(r), s.GroupEndpoints(g); !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d (op %d), group %s: roster %+v, GroupEndpoints %+v", step, op, g, got, want)
			}
			if r == nil {
				continue
			}
			if len(r.Briefs) != len(r.Endpoints) {
				t.Fatalf("step %d: %d briefs for %d endpoints", step, len(r.Briefs), len(r.Endpoints))
			}
			for i, e := range r.Endpoints {
				if r.Briefs[i] != e.Brief() {
					t.Fatalf("step %d (op %d): brief %+v of %+v", step, op, r.Briefs[i], *e)
				}
			}
			if again := s.Roster(g); again != r {
				t.Fatalf("step %d: a read with nothing changed built a new roster", step)
			}
			if prev != nil && prev != r {
				if prev.Version >= r.Version {
					t.Fatalf("step %d: roster version %d after %d", step, r.Version, prev.Version)
				}
				if target != "" { // an op on one endpoint: the others keep their copy
					byURL := map[string]*Endpoint{}
					for _, e := range prev.Endpoints {
						byURL[e.URL] = e
					}
					for _, e := range r.Endpoints {
						if p := byURL[e.URL]; e.URL != target && p != e {
							t.Fatalf("step %d (op %d on %s): %s copied again", step, op, target, e.URL)
						}
					}
				}
			}
			old = append(old, kept{r, values(r)})
		}
		if len(old) > 16 {
			old = old[len(old)-16:]
		}
		for _, k := range old {
			if !reflect.DeepEqual(values(k.r), k.vals) {
				t.Fatalf("step %d: a roster read earlier changed (version %d)", step, k.r.Version)
			}
		}
	}
}

// TestRosterSeesChangeAtOnce: a load report, an ejection and a new
// endpoint are in the very next roster read.
func TestRosterSeesChangeAtOnce(t *testing.T) {
	s := newState(t, 8)
	mustRegister(t, s, "s", ident("http://a", "m"), ident("http://b", "m"))
	g := ident("", "m").Group()
	now := time.Unix(10, 0)
	r0 := s.Roster(g)
	if len(r0.Endpoints) != 2 || r0.Endpoints[0].URL != "http://a" {
		t.Fatalf("roster %+v", values(r0))
	}
	s.ApplyLoad("s", "http://b", Load{Waiting: 7}, now)
	r1 := s.Roster(g)
	if r1.Endpoints[1].Load.Waiting != 7 || !r1.Endpoints[1].LoadAt.Equal(now) {
		t.Fatalf("the load report is not in the next roster: %+v", *r1.Endpoints[1])
	}
	if r1.Endpoints[0] != r0.Endpoints[0] {
		t.Error("the endpoint that did not change was copied again")
	}
	if r0.Endpoints[1].Load.Waiting != 0 {
		t.Error("the earlier roster changed")
	}
	s.Failed("http://a", now, "refused", DefaultHealthConfig())
	if r2 := s.Roster(g); r2.Endpoints[0].StateAt(now, DefaultHealthConfig()) != Down {
		t.Fatalf("the ejection is not in the next roster: %+v", *r2.Endpoints[0])
	}
	mustRegister(t, s, "t", ident("http://c", "m"))
	if r3 := s.Roster(g); len(r3.Endpoints) != 3 || r3.Endpoints[2].URL != "http://c" {
		t.Fatalf("the new endpoint is not in the next roster: %+v", values(r3))
	}
	s.Forget("s")
	s.Forget("t")
	if r := s.Roster(g); r != nil {
		t.Fatalf("an emptied group's roster: %+v", values(r))
	}
}

// TestRosterConcurrentReaders: rosters read under a read lock (Roster
// calls serialised by a mutex of their own, as the shells do) by many
// goroutines, each deciding over its roster at length, while a writer
// applies load reports (5 an endpoint between reads), ejects and drops
// endpoints under the write lock: no race (go test -race), every roster
// is sorted and whole, and none changes while it is read.
func TestRosterConcurrentReaders(t *testing.T) {
	s := newState(t, 64)
	var ids []Identity
	for i := range 64 {
		ids = append(ids, ident(fmt.Sprintf("http://e%02d", i), "m"))
	}
	mustRegister(t, s, "s", ids...)
	g := ident("", "m").Group()
	var mu sync.RWMutex
	var rosterMu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the writer: the view's streams and health loop
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 1))
		now := time.Unix(0, 0)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			now = now.Add(time.Millisecond)
			mu.Lock()
			for range 5 {
				s.ApplyLoad("s", ids[rng.IntN(len(ids))].Endpoint, Load{Waiting: float64(i % 7), Running: float64(i % 3)}, now)
			}
			if i%50 == 0 {
				s.Failed(ids[rng.IntN(len(ids))].Endpoint, now, "refused", DefaultHealthConfig())
			}
			if i%200 == 0 { // re-register a varying subset: endpoints leave and come back
				if _, err := s.Register("s", ids[:32+rng.IntN(32)], nil, now); err != nil {
					t.Error(err)
				}
			}
			mu.Unlock()
		}
	}()
	var rwg sync.WaitGroup
	for range 8 {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for range 100 {
				mu.RLock()
				rosterMu.Lock()
				r := s.Roster(g)
				rosterMu.Unlock()
				_ = s.GroupEndpoints(g) // another reader at once
				mu.RUnlock()
				if r == nil {
					t.Error("no roster")
					return
				}
				first := values(r)
				for i, e := range r.Endpoints { // decide over it, outside the lock
					if i > 0 && r.Endpoints[i-1].URL >= e.URL {
						t.Errorf("roster not sorted at %d", i)
					}
					_ = e.StateAt(time.Unix(0, 0), DefaultHealthConfig())
				}
				if !reflect.DeepEqual(values(r), first) {
					t.Error("a roster changed while read")
				}
			}
		}()
	}
	rwg.Wait()
	close(stop)
	wg.Wait()
}

// TestStateAtIsHealthAt: StateAt, and a brief's StateAt, judge as
// HealthAt does, over endpoints with every signal set at random, at times
// around their limits.
func TestStateAtIsHealthAt(t *testing.T) {
	c := DefaultHealthConfig()
	rng := rand.New(rand.NewPCG(3, 3))
	now := time.Unix(1000, 0)
	ago := func() time.Time {
		if rng.IntN(4) == 0 {
			return time.Time{}
		}
		return now.Add(-time.Duration(rng.IntN(15000)) * time.Millisecond)
	}
	for range 20000 {
		e := Endpoint{Since: ago(), LastUpdate: ago(), SidecarLost: ago(), EngineAnswers: rng.IntN(2) == 0,
			Ejected: rng.IntN(5) == 0, EjectedUntil: now.Add(time.Duration(rng.IntN(3)-1) * time.Second),
			StreamState: []string{"", StreamLive, StreamSilent, StreamReplayOnly, StreamPartial, StreamUnknown}[rng.IntN(6)]}
		e.Load.EngineDown, e.Load.Draining, e.Info.Partial = rng.IntN(6) == 0, rng.IntN(6) == 0, rng.IntN(6) == 0
		b := e.Brief()
		for _, at := range []time.Time{now, now.Add(-c.StaleSummary), now.Add(c.StaleSummary), now.Add(c.DownAfter), now.Add(time.Second)} {
			h := e.HealthAt(at, c)
			if st := e.StateAt(at, c); h.State != st {
				t.Fatalf("%+v at %v: HealthAt %v, StateAt %v", e, at, h, st)
			}
			if st := b.StateAt(at, c); h.State != st {
				t.Fatalf("%+v at %v: HealthAt %v, the brief's StateAt %v", e, at, h, st)
			}
		}
	}
}

// TestRosterAfterManyUnreadChanges: many changes with no read between
// them (more marks than the group has endpoints) and then one, and a
// change of membership among them: the roster read after is exact.
func TestRosterAfterManyUnreadChanges(t *testing.T) {
	s := newState(t, 8)
	mustRegister(t, s, "s", ident("http://a", "m"), ident("http://b", "m"), ident("http://c", "m"))
	g := ident("", "m").Group()
	_ = s.Roster(g)
	now := time.Unix(10, 0)
	for i := range 50 {
		s.ApplyLoad("s", []string{"http://a", "http://b", "http://c"}[i%3], Load{Waiting: float64(i)}, now.Add(time.Duration(i)))
		if i == 20 {
			_ = s.Roster(g) // read once in the middle
		}
	}
	check := func(when string) {
		t.Helper()
		r := s.Roster(g)
		if got, want := values(r), s.GroupEndpoints(g); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: roster %+v, GroupEndpoints %+v", when, got, want)
		}
		for i, e := range r.Endpoints {
			if r.Briefs[i] != e.Brief() {
				t.Fatalf("%s: brief %+v of %+v", when, r.Briefs[i], *e)
			}
		}
	}
	check("after 50 loads")
	mustRegister(t, s, "s", ident("http://a", "m"), ident("http://c", "m")) // b leaves
	s.ApplyLoad("s", "http://c", Load{Waiting: 99}, now)
	check("after b left")
	mustRegister(t, s, "t", ident("http://b", "m"))
	s.ApplyLoad("t", "http://b", Load{Running: 3}, now)
	s.ApplyLoad("s", "http://a", Load{Running: 4}, now)
	check("after b came back")
}

// TestRosterIndexAndClone: Index finds every endpoint of a state's
// roster, of one made in another order, and of a part; none it does not
// hold. A clone's slices are its own.
func TestRosterIndexAndClone(t *testing.T) {
	s := newState(t, 8)
	mustRegister(t, s, "s", ident("http://c", "m"), ident("http://a", "m"), ident("http://b", "m"))
	r := s.Roster(ident("", "m").Group())
	rev := NewRoster([]*Endpoint{r.Endpoints[2], r.Endpoints[0], r.Endpoints[1]})
	part := r.Only(map[string]bool{"http://a": true, "http://c": true})
	for _, ro := range []*Roster{r, rev, part} {
		for i, e := range ro.Endpoints {
			if j, ok := ro.Index(e.URL); !ok || j != i {
				t.Errorf("Index(%s) = %d, %v; want %d", e.URL, j, ok, i)
			}
		}
		if _, ok := ro.Index("http://x"); ok {
			t.Error("Index found an endpoint the roster does not hold")
		}
	}
	c := r.Clone()
	c.Endpoints[0], c.Briefs[0] = c.Endpoints[1], c.Briefs[1]
	if r.Endpoints[0].URL != "http://a" || r.Briefs[0].URL != "http://a" {
		t.Error("changing a clone changed the roster")
	}
}

// BenchmarkRoster: reading a 1,000-endpoint group's roster with k load
// reports applied since the last read (ApplyLoad, each marking its
// endpoint), against copying the group out (GroupEndpoints, what a
// request did before rosters). At 1,000 decisions a second and 5 load
// reports an endpoint a second, k is 5.
func BenchmarkRoster(b *testing.B) {
	s := newState(b, 1024)
	var ids []Identity
	for i := range 1000 {
		ids = append(ids, ident(fmt.Sprintf("http://e%04d:8000", i), "m"))
	}
	mustRegister(b, s, "s", ids...)
	g := ident("", "m").Group()
	now := time.Unix(1, 0)
	for _, id := range ids {
		s.ApplyLoad("s", id.Endpoint, Load{Waiting: 1}, now)
	}
	for _, k := range []int{0, 1, 5, 50, 1000} {
		b.Run(fmt.Sprintf("loads=%d", k), func(b *testing.B) {
			b.ReportAllocs()
			next := 0
			for range b.N {
				for range k {
					now = now.Add(time.Microsecond)
					s.ApplyLoad("s", ids[next%len(ids)].Endpoint, Load{Waiting: float64(next % 7)}, now)
					next++
				}
				if r := s.Roster(g); len(r.Endpoints) != 1000 {
					b.Fatal("not the group's 1,000 endpoints")
				}
			}
		})
	}
	b.Run("copy/GroupEndpoints", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if len(s.GroupEndpoints(g)) != 1000 {
				b.Fatal("not the group's 1,000 endpoints")
			}
		}
	})
	b.Run("loads=5/apply-only", func(b *testing.B) { // the writers' share: five marked load reports
		b.ReportAllocs()
		next := 0
		for range b.N {
			for range 5 {
				now = now.Add(time.Microsecond)
				s.ApplyLoad("s", ids[next%len(ids)].Endpoint, Load{Waiting: float64(next % 7)}, now)
				next++
			}
		}
	})
}
