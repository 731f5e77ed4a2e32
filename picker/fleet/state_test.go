package fleet

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
)

// testParams are small summaries: 16,384 bits, 256 snapshot words.
func testParams() summary.Params { return summary.ForCapacity(1024) }

func newState(t testing.TB, slots int) *State {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Params, cfg.Slots = testParams(), slots
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ident is an endpoint of model m with the fleet's summary parameters.
func ident(url, model string) Identity {
	return Identity{Endpoint: url, Model: model, BlockSize: 16, KeyFormat: blockkey.FormatV1,
		SummaryParams: testParams().String(), Epoch: 1}
}

// keys returns n distinct keys from base.
func keys(n int, base uint64) []blockkey.Key {
	out := make([]blockkey.Key, n)
	for i := range out {
		out[i] = blockkey.Key((base + uint64(i) + 1) * 0x9e3779b97f4a7c15)
	}
	return out
}

// summaryOf is a sidecar-side summary holding ks, its delta taken (seq 1).
func summaryOf(ks ...blockkey.Key) *summary.Counting {
	c := summary.NewCounting(testParams())
	for _, k := range ks {
		c.Add(k)
	}
	c.TakeDelta()
	return c
}

// mustRegister registers eps for sidecar, no other owner live, and fails
// on any error.
func mustRegister(t testing.TB, s *State, sidecar string, eps ...Identity) Registration {
	t.Helper()
	reg, err := s.Register(sidecar, eps, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// snapshot loads c's snapshot into url's summary in tier tr, whole.
func snapshot(t testing.TB, s *State, sidecar, url string, tr tier.Tier, epoch uint64, c *summary.Counting) {
	t.Helper()
	l, err := s.StartSnapshot(sidecar, url, tr, epoch, c.Snapshot(), time.Unix(1, 0))
	if err != nil || l == nil {
		t.Fatalf("StartSnapshot: %v, %v", l, err)
	}
	if done, err := l.Step(1 << 20); !done || err != nil {
		t.Fatalf("Step: %v, %v", done, err)
	}
}

func urls(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.URL)
	}
	return out
}

func TestConfig(t *testing.T) {
	ok := DefaultConfig()
	ok.Params = testParams()
	if DefaultConfig().Slots != DefaultSlots || ok.Validate() != nil {
		t.Fatalf("defaults %+v: %v", DefaultConfig(), ok.Validate())
	}
	for name, c := range map[string]Config{
		"defaults without params": DefaultConfig(),
		"zero":                    {},
		"zero slots":              {Params: testParams()},
		"too many slots":          {Params: testParams(), Slots: MaxSlots + 1},
		"negative slots":          {Params: testParams(), Slots: -1},
	} {
		if c.Validate() == nil {
			t.Errorf("%s: valid", name)
		}
		if _, err := New(c); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}

// TestRegister: endpoints are taken or refused for every reason; a
// refusal is listed until the endpoint is taken, no longer offered, or its
// sidecar forgotten.
func TestRegister(t *testing.T) {
	other := ident("http://c", "m")
	other.SummaryParams = summary.ForCapacity(99).String()
	for _, tc := range []struct {
		name     string
		slots    int
		before   map[string][]Identity // sidecar → endpoints, registered first
		live     map[string]bool       // sidecars with a live stream
		offer    []Identity            // by sidecar "s"
		taken    []string              // URLs held by "s" afterwards
		refused  map[string]string     // URL → reason, this call's
		endpoint int                   // endpoints held in all
	}{
		{name: "taken", slots: 4, offer: []Identity{ident("http://a", "m"), ident("http://b", "m")},
			taken: []string{"http://a", "http://b"}, endpoint: 2},
		{name: "summary params differ", slots: 4, offer: []Identity{ident("http://a", "m"), other},
			taken: []string{"http://a"}, refused: map[string]string{"http://c": ReasonSummaryParams}, endpoint: 1},
		{name: "group full", slots: 2, offer: []Identity{ident("http://a", "m"), ident("http://b", "m"), ident("http://c", "m"), ident("http://d", "n")},
			taken: []string{"http://a", "http://b", "http://d"}, refused: map[string]string{"http://c": ReasonGroupFull}, endpoint: 3},
		{name: "other owner live", slots: 4, before: map[string][]Identity{"t": {ident("http://a", "m")}}, live: map[string]bool{"t": true},
			offer: []Identity{ident("http://a", "m"), ident("http://b", "m")},
			taken: []string{"http://b"}, refused: map[string]string{"http://a": ReasonOtherOwner}, endpoint: 2},
		{name: "other owner not live: passes over", slots: 4, before: map[string][]Identity{"t": {ident("http://a", "m")}}, live: map[string]bool{"u": true},
			offer: []Identity{ident("http://a", "m")}, taken: []string{"http://a"}, endpoint: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newState(t, tc.slots)
			for sc, eps := range tc.before {
				mustRegister(t, s, sc, eps...)
			}
			reg, err := s.Register("s", tc.offer, func(sc string) bool { return tc.live[sc] }, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, r := range reg.Refused {
				if r.Sidecar != "s" {
					t.Errorf("refusal %+v names another sidecar", r)
				}
				got[r.Info.Endpoint] = r.Reason
			}
			if len(got) != len(tc.refused) || (len(got) > 0 && !reflect.DeepEqual(got, tc.refused)) {
				t.Errorf("refused %v, want %v", got, tc.refused)
			}
			listed := map[string]string{}
			for _, r := range s.Refused() {
				listed[r.Info.Endpoint] = r.Reason
			}
			if !reflect.DeepEqual(listed, got) {
				t.Errorf("Refused() %v, want this call's %v", listed, got)
			}
			var mine []string
			for _, e := range s.Endpoints() {
				if e.Sidecar == "s" {
					mine = append(mine, e.URL)
					if e.Group != e.Info.Group() || e.Info.Endpoint != e.URL {
						t.Errorf("endpoint %+v", e)
					}
				}
			}
			if !reflect.DeepEqual(mine, tc.taken) || len(s.Endpoints()) != tc.endpoint {
				t.Errorf("taken %v of %d, want %v of %d", mine, len(s.Endpoints()), tc.taken, tc.endpoint)
			}
		})
	}
}

func TestRefusalsClear(t *testing.T) {
	s := newState(t, 1)
	mustRegister(t, s, "s", ident("http://a", "m"), ident("http://b", "m")) // b: group full
	if r := s.Refused(); len(r) != 1 || r[0].Info.Endpoint != "http://b" || r[0].Reason != ReasonGroupFull {
		t.Fatalf("refused %+v", r)
	}
	mustRegister(t, s, "s", ident("http://b", "m")) // a no longer served: b takes its slot
	if r := s.Refused(); len(r) != 0 {
		t.Fatalf("refused after b was taken: %+v", r)
	}
	if got := urls(s.Endpoints()); !reflect.DeepEqual(got, []string{"http://b"}) {
		t.Fatalf("endpoints %v", got)
	}
	mustRegister(t, s, "t", ident("http://c", "m")) // c: group full
	mustRegister(t, s, "t", ident("http://d", "n")) // c no longer offered
	if r := s.Refused(); len(r) != 0 {
		t.Fatalf("refusal of an endpoint no longer offered kept: %+v", r)
	}
	mustRegister(t, s, "t", ident("http://c", "m"))
	s.Forget("t")
	if r := s.Refused(); len(r) != 0 {
		t.Fatalf("refusal kept past its sidecar: %+v", r)
	}
}

// TestOwnerAndIdentityChange: an endpoint that passes to another sidecar,
// or whose identity changes, starts over with no summary; a group left
// empty is dropped with its indexes.
func TestOwnerAndIdentityChange(t *testing.T) {
	ks := keys(8, 0)
	s := newState(t, 4)
	a := ident("http://a", "m")
	mustRegister(t, s, "s", a, ident("http://b", "m"))
	snapshot(t, s, "s", "http://a", tier.GPU, 1, summaryOf(ks...))
	g := a.Group()
	if got := s.Match(g, tier.GPU, ks)["http://a"]; got != 8 {
		t.Fatalf("matched %d", got)
	}

	// Owner change (the first owner's stream is gone).
	reg := mustRegister(t, s, "t", a)
	if len(reg.Positions) != 0 {
		t.Fatalf("positions carried to a new owner: %+v", reg.Positions)
	}
	if got := s.Match(g, tier.GPU, ks)["http://a"]; got != 0 {
		t.Fatalf("new owner inherits the old summary: matched %d", got)
	}
	if l, err := s.StartSnapshot("s", "http://a", tier.GPU, 1, summaryOf().Snapshot(), time.Unix(2, 0)); l != nil || err != nil {
		t.Fatalf("the old owner still writes: %v, %v", l, err)
	}

	// Identity change: a new model moves it to another group.
	b := ident("http://a", "m2")
	mustRegister(t, s, "t", b)
	eps := s.Endpoints()
	byURL := map[string]Endpoint{}
	for _, e := range eps {
		byURL[e.URL] = e
	}
	if e := byURL["http://a"]; e.Group != b.Group() || e.Group == g || e.Info.Model != "m2" || e.Sidecar != "t" {
		t.Fatalf("moved endpoint %+v", e)
	}
	if _, ok := s.Match(g, tier.GPU, ks)["http://a"]; ok {
		t.Fatal("the moved endpoint is still matched in its old group")
	}
	if _, ok := s.groups[g]; !ok {
		t.Fatal("group dropped while b still in it")
	}

	// b's sidecar forgotten: the old group is empty and dropped.
	s.Forget("s")
	if _, ok := s.groups[g]; ok || s.Match(g, tier.GPU, ks) != nil {
		t.Fatal("an empty group is kept")
	}
	if got := urls(s.Endpoints()); !reflect.DeepEqual(got, []string{"http://a"}) {
		t.Fatalf("endpoints %v", got)
	}
	s.Forget("t")
	if len(s.Endpoints()) != 0 || len(s.groups) != 0 {
		t.Fatalf("after forgetting everyone: %d endpoints, %d groups", len(s.Endpoints()), len(s.groups))
	}
}

// TestForget drops one sidecar's endpoints from every tier, and no other's.
func TestForget(t *testing.T) {
	ks := keys(4, 100)
	s := newState(t, 4)
	mustRegister(t, s, "s", ident("http://a", "m"))
	mustRegister(t, s, "t", ident("http://b", "m"))
	for _, tr := range []tier.Tier{tier.GPU, tier.CPU} {
		snapshot(t, s, "s", "http://a", tr, 1, summaryOf(ks...))
		snapshot(t, s, "t", "http://b", tr, 1, summaryOf(ks...))
	}
	s.Forget("s")
	s.Forget("nobody")
	g := ident("http://a", "m").Group()
	for _, tr := range []tier.Tier{tier.GPU, tier.CPU} {
		if got := s.Match(g, tr, ks); !reflect.DeepEqual(got, map[string]int{"http://b": 4}) {
			t.Errorf("%v: %v", tr, got)
		}
	}
	if s.Positions("http://a") != nil || len(s.Positions("http://b")) != 2 {
		t.Errorf("positions %v, %v", s.Positions("http://a"), s.Positions("http://b"))
	}
}

func TestApplyLoad(t *testing.T) {
	s := newState(t, 4)
	mustRegister(t, s, "s", ident("http://a", "m"))
	now := time.Unix(100, 0)
	l := Load{Waiting: 2, Running: 3, KVCacheUsage: 0.5}
	if s.ApplyLoad("t", "http://a", l, now) || s.ApplyLoad("s", "http://x", l, now) {
		t.Fatal("a load report for an endpoint the sidecar does not own was applied")
	}
	if e := s.Endpoints()[0]; e.HasLoad() || !e.LastUpdate.IsZero() {
		t.Fatalf("ignored report recorded: %+v", e)
	}
	if !s.ApplyLoad("s", "http://a", l, now) {
		t.Fatal("not applied")
	}
	e := s.Endpoints()[0]
	if e.Load != l || !e.LoadAt.Equal(now) || !e.LastUpdate.Equal(now) {
		t.Fatalf("endpoint %+v", e)
	}
	hc := DefaultHealthConfig()
	if e.HealthAt(now.Add(time.Second), hc).State != Cached || e.HealthAt(now.Add(hc.StaleSummary+time.Second), hc).State != LoadOnly {
		t.Fatal("health of the recorded report")
	}
	later := now.Add(time.Minute)
	if !s.Touch("s", "http://a", later) || s.Touch("t", "http://a", later) {
		t.Fatal("Touch ownership")
	}
	if e := s.Endpoints()[0]; !e.LastUpdate.Equal(later) || !e.LoadAt.Equal(now) {
		t.Fatalf("after Touch %+v", e)
	}
	e.Load.Waiting = 99 // a copy
	if s.Endpoints()[0].Load != l {
		t.Fatal("Endpoints returned the state's own values")
	}
}

// TestSnapshotSteps: a snapshot load leaves the endpoint absent in its
// tier until its last step, and is abandoned by any change meanwhile.
func TestSnapshotSteps(t *testing.T) {
	ks := keys(6, 200)
	a := ident("http://a", "m")
	g := a.Group()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, s *State) // between the first and the second step; nil: none
	}{
		{name: "complete"},
		{name: "forgotten", change: func(t *testing.T, s *State) { s.Forget("s") }},
		{name: "owner changed", change: func(t *testing.T, s *State) { mustRegister(t, s, "t", a) }},
		{name: "identity changed", change: func(t *testing.T, s *State) { mustRegister(t, s, "s", ident("http://a", "m2")) }},
		{name: "another snapshot", change: func(t *testing.T, s *State) {
			if _, err := s.StartSnapshot("s", "http://a", tier.GPU, 2, summaryOf().Snapshot(), time.Unix(3, 0)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "bad delta", change: func(t *testing.T, s *State) {
			_, _ = s.ApplyDelta("s", "http://a", tier.GPU, 1, summary.Delta{Seq: 2, Flips: []uint32{1 << 30}}, time.Unix(3, 0))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newState(t, 4)
			mustRegister(t, s, "s", a)
			snapshot(t, s, "s", "http://a", tier.GPU, 1, summaryOf(ks[:2]...)) // an old summary
			c := summaryOf(ks...)
			c.Add(keys(1, 999)[0])
			c.TakeDelta() // seq 2
			now := time.Unix(2, 0)
			l, err := s.StartSnapshot("s", "http://a", tier.GPU, 1, c.Snapshot(), now)
			if err != nil || l == nil {
				t.Fatalf("StartSnapshot: %v, %v", l, err)
			}
			if e := s.Endpoints()[0]; !e.LastUpdate.Equal(now) {
				t.Fatalf("last update %v", e.LastUpdate)
			}
			words := int(testParams().M / 64)
			for step := 0; ; step++ {
				if m := s.Match(g, tier.GPU, ks)["http://a"]; m != 0 || s.Positions("http://a") != nil {
					t.Fatalf("step %d: half a summary shows: matched %d, positions %v", step, m, s.Positions("http://a"))
				}
				if step == 1 && tc.change != nil {
					tc.change(t, s)
				}
				done, err := l.Step(words / 4)
				if tc.change != nil && step >= 1 {
					if !errors.Is(err, summary.ErrAbandoned) {
						t.Fatalf("after the change: %v, %v, want abandoned", done, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if done {
					if step != 3 {
						t.Fatalf("done after %d steps", step+1)
					}
					break
				}
			}
			if m := s.Match(g, tier.GPU, ks)["http://a"]; m != 6 {
				t.Fatalf("matched %d after the load", m)
			}
			if p := s.Positions("http://a"); !reflect.DeepEqual(p, []Position{{Endpoint: "http://a", Tier: tier.GPU, Epoch: 1, Seq: 2}}) {
				t.Fatalf("positions %+v", p)
			}
		})
	}
}

// TestApplyDelta: deltas in order apply; one that does not follow asks
// for a resync and one that cannot apply is malformed, both dropping the
// endpoint's summary in that tier (and only there).
func TestApplyDelta(t *testing.T) {
	ks := keys(8, 300)
	a := ident("http://a", "m")
	g := a.Group()
	c := summaryOf(ks[:4]...) // seq 1
	base := c.Snapshot()
	for _, k := range ks[4:] {
		c.Add(k)
	}
	d2, _ := c.TakeDelta()
	c.Add(keys(1, 777)[0])
	d3, _ := c.TakeDelta()
	for _, tc := range []struct {
		name    string
		sidecar string
		tier    tier.Tier
		epoch   uint64
		delta   summary.Delta
		applied bool
		fault   Fault
		matched int // afterwards, GPU
		cpu     int // afterwards, CPU (untouched unless the delta is for it)
	}{
		{name: "in order", sidecar: "s", tier: tier.GPU, epoch: 1, delta: d2, applied: true, matched: 8, cpu: 4},
		{name: "skipped one", sidecar: "s", tier: tier.GPU, epoch: 1, delta: d3, fault: Resync, matched: 0, cpu: 4},
		{name: "repeated", sidecar: "s", tier: tier.GPU, epoch: 1, delta: summary.Delta{Seq: 1}, fault: Resync, matched: 0, cpu: 4},
		{name: "other epoch", sidecar: "s", tier: tier.GPU, epoch: 2, delta: d2, fault: Resync, matched: 0, cpu: 4},
		{name: "no base in tier", sidecar: "s", tier: tier.Storage, epoch: 1, delta: d2, fault: Resync, matched: 4, cpu: 4},
		{name: "flip beyond m", sidecar: "s", tier: tier.GPU, epoch: 1, delta: summary.Delta{Seq: 2, Flips: []uint32{testParams().M}}, fault: Malformed, matched: 0, cpu: 4},
		{name: "no tier", sidecar: "s", tier: tier.Tier(tier.Count), epoch: 1, delta: d2, fault: Malformed, matched: 4, cpu: 4},
		{name: "in order, CPU", sidecar: "s", tier: tier.CPU, epoch: 1, delta: d2, applied: true, matched: 4, cpu: 8},
		{name: "another sidecar's", sidecar: "t", tier: tier.GPU, epoch: 1, delta: d2, matched: 4, cpu: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newState(t, 4)
			mustRegister(t, s, "s", a)
			for _, tr := range []tier.Tier{tier.GPU, tier.CPU} {
				l, err := s.StartSnapshot("s", "http://a", tr, 1, base, time.Unix(1, 0))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := l.Step(1 << 20); err != nil {
					t.Fatal(err)
				}
			}
			now := time.Unix(5, 0)
			applied, err := s.ApplyDelta(tc.sidecar, "http://a", tc.tier, tc.epoch, tc.delta, now)
			if applied != tc.applied || FaultOf(err) != tc.fault {
				t.Fatalf("applied %v, %v; want %v, fault %v", applied, err, tc.applied, tc.fault)
			}
			var ue *UpdateError
			if tc.fault != 0 && (!errors.As(err, &ue) || ue.Endpoint != "http://a" || ue.Tier != tc.tier || ue.Err == nil) {
				t.Fatalf("error %#v", err)
			}
			if got := s.Match(g, tier.GPU, ks)["http://a"]; got != tc.matched {
				t.Errorf("GPU matched %d, want %d", got, tc.matched)
			}
			if got := s.Match(g, tier.CPU, ks)["http://a"]; got != tc.cpu {
				t.Errorf("CPU matched %d, want %d", got, tc.cpu)
			}
			heard := s.Endpoints()[0].LastUpdate.Equal(now)
			if heard != (tc.sidecar == "s") {
				t.Errorf("last update recorded: %v", heard)
			}
		})
	}
	if FaultOf(errors.New("other")) != 0 || FaultOf(nil) != 0 || Resync.String() != "resync" || Malformed.String() != "malformed" {
		t.Error("FaultOf or Fault names")
	}
}

func TestStartSnapshotRefusals(t *testing.T) {
	s := newState(t, 4)
	mustRegister(t, s, "s", ident("http://a", "m"))
	snap := summaryOf(keys(3, 0)...).Snapshot()
	if l, err := s.StartSnapshot("s", "http://nobody", tier.GPU, 1, snap, time.Unix(1, 0)); l != nil || err != nil {
		t.Fatalf("unknown endpoint: %v, %v", l, err)
	}
	if _, err := s.StartSnapshot("s", "http://a", tier.Tier(7), 1, snap, time.Unix(1, 0)); FaultOf(err) != Malformed {
		t.Fatalf("unknown tier: %v", err)
	}
	snapshot(t, s, "s", "http://a", tier.GPU, 1, summaryOf(keys(3, 0)...))
	short := snap
	short.Words = short.Words[:1]
	if _, err := s.StartSnapshot("s", "http://a", tier.GPU, 1, short, time.Unix(1, 0)); FaultOf(err) != Malformed {
		t.Fatalf("short snapshot: %v", err)
	}
	if m := s.Match(ident("http://a", "m").Group(), tier.GPU, keys(3, 0))["http://a"]; m != 0 {
		t.Fatalf("a malformed snapshot left the old summary routable: matched %d", m)
	}
}

// TestMatchVerifiesLeaders: the index's search over depth assumes
// prefix-closed caches; an endpoint that holds a chain with a gap is cut
// to its verified prefix, and the next leader wins.
func TestMatchVerifiesLeaders(t *testing.T) {
	ks := keys(16, 400)
	s := newState(t, 4)
	mustRegister(t, s, "s", ident("http://gap", "m"), ident("http://full", "m"), ident("http://short", "m"), ident("http://empty", "m"))
	gapped := append(append([]blockkey.Key{}, ks[:5]...), ks[6:]...) // lost block 5, kept its children
	snapshot(t, s, "s", "http://gap", tier.GPU, 1, summaryOf(gapped...))
	snapshot(t, s, "s", "http://full", tier.GPU, 1, summaryOf(ks[:10]...))
	snapshot(t, s, "s", "http://short", tier.GPU, 1, summaryOf(ks[:3]...))
	g := ident("http://gap", "m").Group()

	// The case needs the search to be fooled: the raw index result for
	// the gapped endpoint is past its gap.
	f := s.groups[g].tiers[tier.GPU]
	raw := make([]int, f.Slots())
	f.Match(ks, raw)
	if raw[s.endpoints["http://gap"].slot] <= 5 {
		t.Fatalf("the search saw the gap itself (%d): the case does not test verification", raw[s.endpoints["http://gap"].slot])
	}
	want := map[string]int{"http://gap": 5, "http://full": 10, "http://short": 3} // http://empty holds none: absent
	if got := s.Match(g, tier.GPU, ks); !reflect.DeepEqual(got, want) {
		t.Fatalf("matched %v, want %v", got, want)
	}
	if got := s.Match(g, tier.CPU, ks); got != nil {
		t.Fatalf("tier with no summary: %v", got)
	}
	if got := s.Match(g, tier.Tier(tier.Count), ks); got != nil {
		t.Fatalf("invalid tier: %v", got)
	}
	if got := s.Match("nogroup", tier.GPU, ks); got != nil {
		t.Fatalf("unknown group: %v", got)
	}
	if got := s.Match(g, tier.GPU, nil); got == nil || len(got) != 0 {
		t.Fatalf("empty chain: %v", got)
	}
}

// TestPositionsForResume: re-registering keeps an endpoint's summaries and
// returns their positions, per tier, for the stream to resume from.
func TestPositionsForResume(t *testing.T) {
	s := newState(t, 4)
	a, b := ident("http://a", "m"), ident("http://b", "m")
	if reg := mustRegister(t, s, "s", a, b); len(reg.Positions) != 0 || len(reg.Refused) != 0 {
		t.Fatalf("fresh registration %+v", reg)
	}
	c := summaryOf(keys(4, 0)...)
	snapshot(t, s, "s", "http://a", tier.GPU, 3, c)
	c.Add(keys(1, 50)[0])
	d, _ := c.TakeDelta()
	if ok, err := s.ApplyDelta("s", "http://a", tier.GPU, 3, d, time.Unix(9, 0)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	snapshot(t, s, "s", "http://a", tier.Storage, 4, summaryOf(keys(2, 0)...))
	snapshot(t, s, "s", "http://b", tier.CPU, 1, summaryOf())
	b.Epoch = 2 // the identity is replaced, the summaries kept
	reg := mustRegister(t, s, "s", a, b)
	want := []Position{
		{Endpoint: "http://a", Tier: tier.GPU, Epoch: 3, Seq: 2},
		{Endpoint: "http://a", Tier: tier.Storage, Epoch: 4, Seq: 1},
		{Endpoint: "http://b", Tier: tier.CPU, Epoch: 1, Seq: 0}, // an empty summary: no delta yet
	}
	if !reflect.DeepEqual(reg.Positions, want) {
		t.Fatalf("positions %+v, want %+v", reg.Positions, want)
	}
	if e := s.Endpoints()[1]; e.URL != "http://b" || e.Info.Epoch != 2 {
		t.Fatalf("identity not replaced: %+v", e)
	}
}

// TestGrowsWithSlots: a group's index grows past 64 endpoints as they
// come, keeping what it holds.
func TestGrowsWithSlots(t *testing.T) {
	s := newState(t, 200)
	ks := keys(4, 0)
	mustRegister(t, s, "s", ident("http://0", "m"))
	snapshot(t, s, "s", "http://0", tier.GPU, 1, summaryOf(ks...))
	var eps []Identity
	for i := range 150 {
		eps = append(eps, ident("http://"+string(rune('A'+i%26))+string(rune('a'+i/26)), "m"))
	}
	mustRegister(t, s, "t", eps...)
	last := eps[len(eps)-1].Endpoint
	snapshot(t, s, "t", last, tier.GPU, 1, summaryOf(ks[:2]...))
	got := s.Match(eps[0].Group(), tier.GPU, ks)
	if len(got) != 2 || got["http://0"] != 4 || got[last] != 2 {
		t.Fatalf("%d matched: first %d, last %d", len(got), got["http://0"], got[last])
	}
}
