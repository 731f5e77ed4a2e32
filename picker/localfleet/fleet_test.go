package localfleet_test

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/localfleet"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/sidecar/index"
)

const (
	urlA = "http://a:8000"
	urlB = "http://b:8000"
)

const gpu, cpu = kvevents.MediumGPU, kvevents.MediumCPU

// TestMatchesFollowEvents: KV events in, matches out, per tier and
// endpoint, as the sidecar keys and summarises them and the fleet state
// matches them.
func TestMatchesFollowEvents(t *testing.T) {
	p := toks(64, 1000) // 4 blocks
	q := toks(32, 5000) // 2 more, continuing p
	type step struct {
		url     string
		b       *kvevents.Batch
		wantErr error // nil: none
	}
	type query struct {
		tier   tier.Tier
		salt   string
		tokens []uint32
		want   map[string]int
	}
	a4 := map[string]int{urlA: 4}
	cases := []struct {
		name    string
		steps   []step
		queries []query
	}{
		{"a run from token 0", []step{{urlA, batch(stored(gpu, 100, 0, "", p, bs)), nil}}, []query{
			{tier.GPU, "", p, a4},
			{tier.GPU, "", p[:40], map[string]int{urlA: 2}},                      // two full blocks of the request
			{tier.GPU, "", cat(p[:32], toks(32, 9000)), map[string]int{urlA: 2}}, // diverges at the third
			{tier.GPU, "", cat(p, q), a4},
			{tier.GPU, "", toks(64, 7000), nil},
			{tier.CPU, "", p, nil},
		}},
		{"a run continued from its parent", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs)), nil},
			{urlA, batch(stored(gpu, 200, 103, "", q, bs)), nil},
		}, []query{{tier.GPU, "", cat(p, q), map[string]int{urlA: 6}}}},
		{"a run whose parent is unknown is dropped", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs)), nil},
			{urlA, batch(stored(gpu, 200, 999, "", q, bs)), index.ErrUnresolvedParent},
		}, []query{{tier.GPU, "", cat(p, q), a4}}},
		{"tail blocks removed", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs)), nil},
			{urlA, batch(removed(gpu, 102, 2)), nil},
		}, []query{{tier.GPU, "", p, map[string]int{urlA: 2}}}},
		{"every block removed", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs), removed(gpu, 100, 4)), nil},
		}, []query{{tier.GPU, "", p, nil}}},
		{"one copy of two removed: the key stays", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs), stored(gpu, 300, 0, "", p, bs)), nil},
			{urlA, batch(removed(gpu, 100, 4)), nil},
		}, []query{{tier.GPU, "", p, a4}}},
		{"tiers apart", []step{{urlA, batch(stored(cpu, 100, 0, "", p, bs)), nil}}, []query{
			{tier.GPU, "", p, nil},
			{tier.CPU, "", p, a4},
		}},
		{"cleared", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs), stored(cpu, 100, 0, "", p, bs)), nil},
			{urlA, batch(cleared()), nil},
		}, []query{{tier.GPU, "", p, nil}, {tier.CPU, "", p, nil}}},
		{"stored again after a clear (a new epoch)", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs)), nil},
			{urlA, batch(cleared()), nil},
			{urlA, batch(stored(gpu, 500, 0, "", p[:48], bs)), nil},
		}, []query{{tier.GPU, "", p, map[string]int{urlA: 3}}}},
		{"cleared and stored in one batch", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs), cleared(), stored(gpu, 500, 0, "", p[:32], bs)), nil},
		}, []query{{tier.GPU, "", p, map[string]int{urlA: 2}}}},
		{"salted chains isolated", []step{
			{urlA, batch(stored(gpu, 100, 0, "tenant-1", p, bs)), nil},
			{urlB, batch(stored(gpu, 100, 0, "", p, bs)), nil},
		}, []query{
			{tier.GPU, "", p, map[string]int{urlB: 4}},
			{tier.GPU, "tenant-1", p, a4},
			{tier.GPU, "tenant-2", p, nil},
		}},
		{"a salted run continued: only the first block carries the salt", []step{
			{urlA, batch(stored(gpu, 100, 0, "tenant-1", p, bs)), nil},
			{urlA, batch(stored(gpu, 200, 103, "", q, bs)), nil},
		}, []query{{tier.GPU, "tenant-1", cat(p, q), map[string]int{urlA: 6}}, {tier.GPU, "", cat(p, q), nil}}},
		{"endpoints apart", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs)), nil},
			{urlB, batch(stored(gpu, 100, 0, "", p[:32], bs)), nil},
		}, []query{{tier.GPU, "", p, map[string]int{urlA: 4, urlB: 2}}}},
		{"one endpoint's removal leaves the other's", []step{
			{urlA, batch(stored(gpu, 100, 0, "", p, bs)), nil},
			{urlB, batch(stored(gpu, 100, 0, "", p[:32], bs)), nil},
			{urlA, batch(removed(gpu, 100, 4)), nil},
		}, []query{{tier.GPU, "", p, map[string]int{urlB: 2}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t, nil, nil)
			now := time.Now()
			add(t, f, now, ident(urlA, model, bs), ident(urlB, model, bs))
			for i, s := range c.steps {
				err := f.Update(s.url, s.b, now)
				if (s.wantErr == nil) != (err == nil) || (s.wantErr != nil && !errors.Is(err, s.wantErr)) {
					t.Fatalf("step %d: %v, want %v", i, err, s.wantErr)
				}
			}
			g := groupOf(t, f, urlA)
			for _, q := range c.queries {
				if got := f.Match(g, q.tier, chain(model, bs, q.salt, q.tokens)); !same(got, q.want) {
					t.Errorf("%s, salt %q, %d tokens: %v, want %v", q.tier, q.salt, len(q.tokens), got, q.want)
				}
			}
		})
	}
}

// TestPublishIsApart: events reach the sidecar (Apply) apart from its
// updates reaching the fleet state (Publish), so a delay can be modelled
// between them; the delay is the endpoint's event-to-routable lag.
func TestPublishIsApart(t *testing.T) {
	c := &clock{now: t0}
	f := newFleet(t, c, nil)
	add(t, f, t0, ident(urlA, model, bs))
	p := toks(64, 1000)
	if err := f.Apply(urlA, batch(stored(gpu, 100, 0, "", p, bs)), c.add(10*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	g := groupOf(t, f, urlA)
	if got := f.Match(g, tier.GPU, chain(model, bs, "", p)); len(got) != 0 {
		t.Fatalf("matched before the sidecar published: %v", got)
	}
	if err := f.Publish(c.add(30 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if got := f.Match(g, tier.GPU, chain(model, bs, "", p)); !same(got, map[string]int{urlA: 4}) {
		t.Fatalf("after Publish: %v", got)
	}
	e := endpoint(t, f, urlA)
	if e.Lag != 30*time.Millisecond {
		t.Errorf("lag %v, want 30ms (applied at +10ms, published at +40ms)", e.Lag)
	}
	if e.Sidecar != localfleet.SidecarPrefix+urlA {
		t.Errorf("sidecar %q", e.Sidecar)
	}
	if err := f.Apply(urlA, batch(removed(gpu, 100, 4)), c.add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if got := f.Match(g, tier.GPU, chain(model, bs, "", p)); !same(got, map[string]int{urlA: 4}) {
		t.Fatalf("a removal seen before it was published: %v", got)
	}
	if err := f.Publish(c.now); err != nil {
		t.Fatal(err)
	}
	if got := f.Match(g, tier.GPU, chain(model, bs, "", p)); len(got) != 0 {
		t.Fatalf("after the removal was published: %v", got)
	}
}

// TestGroupsApart: endpoints of different block sizes or models are
// different identity groups: never listed or matched together, even on
// the same tokens.
func TestGroupsApart(t *testing.T) {
	const other = "meta-llama/Llama-3.1-8B"
	f := newFleet(t, nil, nil)
	now := time.Now()
	a, d := ident(urlA, model, 16), ident("http://d:8000", model, 16)
	b32, c := ident(urlB, model, 32), ident("http://c:8000", other, 16)
	add(t, f, now, a, b32, c, d)
	p := toks(64, 1000)
	for _, id := range []fleet.Identity{a, b32, c, d} {
		if err := f.Update(id.Endpoint, batch(stored(gpu, 100, 0, "", p, id.BlockSize)), now); err != nil {
			t.Fatal(err)
		}
	}
	groups := map[string]bool{}
	for _, url := range []string{urlA, urlB, "http://c:8000"} {
		groups[groupOf(t, f, url)] = true
	}
	if len(groups) != 3 || groupOf(t, f, urlA) != groupOf(t, f, "http://d:8000") {
		t.Fatalf("groups: %v", groups)
	}
	for _, c := range []struct {
		url   string
		m     string
		b     int
		want  map[string]int
		group string // GroupEndpoints
	}{
		{urlA, model, 16, map[string]int{urlA: 4, "http://d:8000": 4}, urlA + " http://d:8000 "},
		{urlB, model, 32, map[string]int{urlB: 2}, urlB + " "},
		{"http://c:8000", other, 16, map[string]int{"http://c:8000": 4}, "http://c:8000 "},
	} {
		g := groupOf(t, f, c.url)
		if got := f.Match(g, tier.GPU, chain(c.m, c.b, "", p)); !same(got, c.want) {
			t.Errorf("%s's group: %v, want %v", c.url, got, c.want)
		}
		if got := urls(f.GroupEndpoints(g)); got != c.group {
			t.Errorf("%s's group lists %q, want %q", c.url, got, c.group)
		}
	}
	if got := urls(f.Endpoints()); got != "http://a:8000 http://b:8000 http://c:8000 http://d:8000 " {
		t.Errorf("endpoints %q", got)
	}
}

// TestLoadsReachEndpoints: a load report reaches the endpoint, stamped at
// its now; one for an endpoint not held is not taken.
func TestLoadsReachEndpoints(t *testing.T) {
	c := &clock{now: t0}
	f := newFleet(t, c, nil)
	add(t, f, t0, ident(urlA, model, bs), ident(urlB, model, bs))
	l := fleet.Load{Waiting: 2, Running: 3, KVCacheUsage: 0.5}
	at := c.add(100 * time.Millisecond)
	if !f.SetLoad(urlA, l, at) {
		t.Fatal("load not taken")
	}
	if f.SetLoad("http://nobody:8000", l, at) {
		t.Error("a load taken for an endpoint not held")
	}
	e := endpoint(t, f, urlA)
	if e.Load != l || !e.LoadAt.Equal(at) || !e.HasLoad() {
		t.Errorf("load %+v at %v", e.Load, e.LoadAt)
	}
	if eb := endpoint(t, f, urlB); eb.HasLoad() {
		t.Error("B has a load")
	}
	f.SetLoad(urlB, fleet.Load{EngineDown: true, EngineError: "refused"}, at)
	if h := endpointHealth(t, f, urlB, c.now); h.State != fleet.Down {
		t.Errorf("engine down: %v", h)
	}
}

func endpointHealth(t *testing.T, f *localfleet.Fleet, url string, now time.Time) fleet.Health {
	e := endpoint(t, f, url)
	return e.HealthAt(now, fleet.DefaultHealthConfig())
}

// decideOn runs the router's decision over a snapshot of f's group for
// the request's tokens, as the picker takes it (picker/prepare.go), with
// no tie tolerance: these tests' prompts are a few blocks, whose cached
// share is within the default TieRatio of the 50 ms a request costs at
// the prior, and they are about which endpoint holds what.
func decideOn(f interface {
	GroupEndpoints(string) []fleet.Endpoint
	Match(string, tier.Tier, []blockkey.Key) map[string]int
}, group string, ch []blockkey.Key, promptTokens int, now time.Time) decide.Decision {
	cfg := decide.DefaultConfig()
	cfg.Score.TieRatio = 0
	req := decide.Request{Request: score.Request{PromptTokens: promptTokens}, BlockSize: bs}
	if len(ch) > 0 {
		req.TieKey = uint64(ch[0])
	}
	snap := decide.Snapshot{Endpoints: f.GroupEndpoints(group)}
	for _, t := range tier.All() {
		snap.Matched[t] = f.Match(group, t, ch)
	}
	return decide.Decide(&cfg, req, snap, now)
}

// TestReportFailure: a failure reaching an engine ejects its endpoint as
// fleetview does (down, not picked); a probe readmits it after the
// backoff, or ejects it again for longer.
func TestReportFailure(t *testing.T) {
	c := &clock{now: t0}
	f := newFleet(t, c, nil)
	add(t, f, t0, ident(urlA, model, bs), ident(urlB, model, bs))
	p := toks(64, 1000)
	for url, n := range map[string]int{urlA: 64, urlB: 32} {
		if err := f.Update(url, batch(stored(gpu, 100, 0, "", p[:n], bs)), t0); err != nil {
			t.Fatal(err)
		}
	}
	g, ch := groupOf(t, f, urlA), chain(model, bs, "", p)
	if d := decideOn(f, g, ch, len(p), c.now); d.Endpoint != urlA || d.MatchedTokens != 64 {
		t.Fatalf("before: %v", d)
	}
	f.ReportFailure(urlA, "connection refused")
	if h := endpointHealth(t, f, urlA, c.now); h.State != fleet.Down || !strings.Contains(h.Reason, "connection refused") {
		t.Fatalf("after a failure: %v", h)
	}
	if d := decideOn(f, g, ch, len(p), c.now); d.Endpoint != urlB || d.MatchedTokens != 32 {
		t.Fatalf("with A ejected: %v", d)
	}
	yes := func(string) bool { return true }
	no := func(string) bool { return false }
	if due := f.Probe(c.add(500*time.Millisecond), yes); len(due) != 0 {
		t.Fatalf("probed during the backoff: %v", due)
	}
	if due := f.Probe(c.add(500*time.Millisecond), no); !slices.Equal(due, []string{urlA}) {
		t.Fatalf("probed %v after the backoff, want A", due)
	}
	if e := endpoint(t, f, urlA); !e.Ejected || !e.EjectedUntil.Equal(c.now.Add(2*time.Second)) {
		t.Fatalf("a failed probe: ejected %v until %v, want a doubled backoff", e.Ejected, e.EjectedUntil)
	}
	if due := f.Probe(c.add(2*time.Second), yes); !slices.Equal(due, []string{urlA}) {
		t.Fatalf("probed %v", due)
	}
	if h := endpointHealth(t, f, urlA, c.now); h.State != fleet.Cached {
		t.Fatalf("readmitted: %v", h)
	}
	if d := decideOn(f, g, ch, len(p), c.now); d.Endpoint != urlA {
		t.Fatalf("readmitted, not picked: %v", d)
	}
	f.ReportFailure("http://nobody:8000", "refused") // not held: nothing happens
}

// TestFreshness: in sync (the default), an endpoint reads as heard from
// at the clock's now however long nothing came; out of sync, it ages as
// over a stream — load-only past StaleSummary, down past DownAfter — and
// any update (a load report) refreshes it.
func TestFreshness(t *testing.T) {
	for _, c := range []struct {
		name   string
		inSync bool
		after  time.Duration
		report time.Duration // a load report this long after the start (0: none)
		beat   time.Duration // an update with nothing to apply, likewise
		want   fleet.HealthState
	}{
		{"in sync, an hour later", true, time.Hour, 0, 0, fleet.Cached},
		{"out of sync, a second later", false, time.Second, 0, 0, fleet.Cached},
		{"out of sync, stale", false, 3 * time.Second, 0, 0, fleet.LoadOnly},
		{"out of sync, silent", false, 11 * time.Second, 0, 0, fleet.Down},
		{"out of sync, a load report a second before", false, 11 * time.Second, 10 * time.Second, 0, fleet.Cached},
		{"out of sync, a heartbeat a second before", false, 11 * time.Second, 0, 10 * time.Second, fleet.Cached},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := &clock{now: t0}
			f := newFleet(t, clk, func(cfg *localfleet.Config) { cfg.InSync = c.inSync })
			add(t, f, t0, ident(urlA, model, bs))
			if err := f.Update(urlA, batch(stored(gpu, 100, 0, "", toks(64, 1000), bs)), t0); err != nil {
				t.Fatal(err)
			}
			if c.report > 0 {
				f.SetLoad(urlA, fleet.Load{}, t0.Add(c.report))
			}
			if c.beat > 0 {
				if err := f.Receive(localfleet.Update{Endpoint: urlA}, t0.Add(c.beat)); err != nil {
					t.Fatal(err)
				}
			}
			now := clk.add(c.after)
			if h := endpointHealth(t, f, urlA, now); h.State != c.want {
				t.Errorf("%v, want %v", h, c.want)
			}
			if eps := f.GroupEndpoints(groupOf(t, f, urlA)); eps[0].HealthAt(now, fleet.DefaultHealthConfig()).State != c.want {
				t.Errorf("GroupEndpoints judges otherwise: %+v", eps[0])
			}
		})
	}
}

// TestSharedSidecar: one engine's sidecar feeds two fleets (two pickers):
// one watching from the start, one joining late from the sidecar's
// snapshots; both end with the same matches. A delta delivered out of
// order drops the summary (resync) until the snapshots are delivered.
func TestSharedSidecar(t *testing.T) {
	params := summary.ForCapacity(capacity)
	sc, err := localfleet.NewSidecar(ident(urlA, model, bs), params)
	if err != nil {
		t.Fatal(err)
	}
	first, late := newFleet(t, nil, nil), newFleet(t, nil, nil)
	now := time.Now()
	deliver := func(f *localfleet.Fleet, us []localfleet.Update) error {
		var errs []error
		for _, u := range us {
			errs = append(errs, f.Receive(u, now))
		}
		return errors.Join(errs...)
	}
	if err := first.Register(sc.Identity(), now); err != nil {
		t.Fatal(err)
	}
	p, q := toks(64, 1000), toks(32, 5000)
	if err := sc.Apply(batch(stored(gpu, 100, 0, "", p, bs)), now); err != nil {
		t.Fatal(err)
	}
	us := sc.Take()
	if len(us) != 2 || us[0].Snapshot == nil || us[1].Delta == nil || us[1].Delta.Seq != 1 {
		t.Fatalf("first take: %+v, want a snapshot and delta 1", us)
	}
	if err := deliver(first, us); err != nil {
		t.Fatal(err)
	}
	if err := late.Register(sc.Identity(), now); err != nil {
		t.Fatal(err)
	}
	if err := deliver(late, sc.Snapshots()); err != nil {
		t.Fatal(err)
	}
	if err := sc.Apply(batch(stored(gpu, 200, 103, "", q, bs)), now); err != nil {
		t.Fatal(err)
	}
	us = sc.Take()
	for _, f := range []*localfleet.Fleet{first, late} {
		if err := deliver(f, us); err != nil {
			t.Fatal(err)
		}
	}
	ch := chain(model, bs, "", cat(p, q))
	g := groupOf(t, first, urlA)
	want := map[string]int{urlA: 6}
	for i, f := range []*localfleet.Fleet{first, late} {
		if got := f.Match(g, tier.GPU, ch); !same(got, want) {
			t.Errorf("fleet %d: %v, want %v", i, got, want)
		}
	}
	// Two deltas; the late fleet gets the second first.
	if err := sc.Apply(batch(removed(gpu, 200, 2)), now); err != nil {
		t.Fatal(err)
	}
	d1 := sc.Take()
	if err := sc.Apply(batch(removed(gpu, 102, 2)), now); err != nil {
		t.Fatal(err)
	}
	d2 := sc.Take()
	if err := deliver(first, append(d1, d2...)); err != nil {
		t.Fatal(err)
	}
	if err := deliver(late, d2); fleet.FaultOf(err) != fleet.Resync {
		t.Fatalf("a delta out of order: %v, want a resync", err)
	}
	if got := late.Match(g, tier.GPU, ch); len(got) != 0 {
		t.Fatalf("the summary is kept after a resync: %v", got)
	}
	if err := deliver(late, sc.Snapshots()); err != nil {
		t.Fatal(err)
	}
	want = map[string]int{urlA: 2}
	for i, f := range []*localfleet.Fleet{first, late} {
		if got := f.Match(g, tier.GPU, ch); !same(got, want) {
			t.Errorf("fleet %d, after the removals: %v, want %v", i, got, want)
		}
	}
}

// TestRestart: an engine restart clears its sidecar and starts a new
// epoch; the fleet follows from its snapshots.
func TestRestart(t *testing.T) {
	f := newFleet(t, nil, nil)
	now := time.Now()
	add(t, f, now, ident(urlA, model, bs))
	p := toks(64, 1000)
	if err := f.Update(urlA, batch(stored(gpu, 100, 0, "", p, bs)), now); err != nil {
		t.Fatal(err)
	}
	g, ch := groupOf(t, f, urlA), chain(model, bs, "", p)
	epoch := f.Sidecar(urlA).Epoch()
	if err := f.Restart(urlA); err != nil {
		t.Fatal(err)
	}
	if err := f.Publish(now); err != nil {
		t.Fatal(err)
	}
	if got := f.Match(g, tier.GPU, ch); len(got) != 0 {
		t.Fatalf("after a restart: %v", got)
	}
	if f.Sidecar(urlA).Epoch() != epoch+1 {
		t.Errorf("epoch %d after %d", f.Sidecar(urlA).Epoch(), epoch)
	}
	if err := f.Update(urlA, batch(stored(gpu, 700, 0, "", p, bs)), now); err != nil {
		t.Fatal(err)
	}
	if got := f.Match(g, tier.GPU, ch); !same(got, map[string]int{urlA: 4}) {
		t.Fatalf("stored after the restart: %v", got)
	}
	if err := f.Restart("http://nobody:8000"); err == nil {
		t.Error("restarted an endpoint not added")
	}
}

// TestAddAndRemove: what Add, Register and Remove take and refuse.
func TestAddAndRemove(t *testing.T) {
	now := time.Now()
	withParams := ident(urlA, model, bs)
	withParams.SummaryParams = summary.ForCapacity(2 * capacity).String()
	otherFormat := ident(urlA, model, bs)
	otherFormat.KeyFormat = "kvroute-other-v9"
	for _, c := range []struct {
		name string
		id   fleet.Identity
		cfg  func(*localfleet.Config)
		want string // in the error; "" none
	}{
		{"an engine", ident(urlA, model, bs), nil, ""},
		{"no URL", ident("", model, bs), nil, "without a URL"},
		{"no block size", ident(urlA, model, 0), nil, "block size 0"},
		{"no model", ident(urlA, "", bs), nil, "empty model"},
		{"other summary parameters", withParams, nil, "summary parameters"},
		{"another key format", otherFormat, nil, "key format"},
		{"a model followed", ident(urlA, model, bs), func(c *localfleet.Config) { c.Models = []string{model} }, ""},
		{"a model not followed", ident(urlA, model, bs), func(c *localfleet.Config) { c.Models = []string{"other"} }, "not among the models followed"},
		{"a full group", ident(urlA, model, bs), func(c *localfleet.Config) { c.Slots = 1 }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t, nil, c.cfg)
			err := f.Add(c.id, now)
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("%v, want %q", err, c.want)
			}
			if err != nil {
				if len(f.Endpoints()) != 0 || f.Sidecar(c.id.Endpoint) != nil {
					t.Fatal("refused, yet held")
				}
				return
			}
			e := endpoint(t, f, c.id.Endpoint)
			if e.Info.KeyFormat != blockkey.FormatV1 || e.Info.SummaryParams != summary.ForCapacity(capacity).String() || e.Info.Epoch != 1 {
				t.Errorf("identity %+v", e.Info)
			}
		})
	}
	f := newFleet(t, nil, func(c *localfleet.Config) { c.Slots = 1 })
	add(t, f, now, ident(urlA, model, bs))
	if err := f.Add(ident(urlA, model, bs), now); err == nil {
		t.Error("added twice")
	}
	if err := f.Add(ident(urlB, model, bs), now); err == nil || !strings.Contains(err.Error(), fleet.ReasonGroupFull) {
		t.Errorf("a second endpoint in a group of one slot: %v", err)
	}
	f.Remove(urlA)
	if len(f.Endpoints()) != 0 || f.Sidecar(urlA) != nil {
		t.Fatal("removed, yet held")
	}
	if err := f.Update(urlA, batch(cleared()), now); err == nil {
		t.Error("an update for an endpoint removed")
	}
	if err := f.Apply(urlA, batch(cleared()), now); err == nil {
		t.Error("events for an endpoint removed")
	}
	add(t, f, now, ident(urlB, model, bs))
}

// TestConfig: Validate rejects zero values; DefaultConfig with Params is
// valid; Models are the configured ones, and a copy.
func TestConfig(t *testing.T) {
	valid := localfleet.DefaultConfig()
	valid.Params = summary.ForCapacity(capacity)
	for _, c := range []struct {
		name string
		edit func(*localfleet.Config)
		ok   bool
	}{
		{"defaults and params", func(*localfleet.Config) {}, true},
		{"zero", func(c *localfleet.Config) { *c = localfleet.Config{} }, false},
		{"no params", func(c *localfleet.Config) { c.Params = summary.Params{} }, false},
		{"no slots", func(c *localfleet.Config) { c.Slots = 0 }, false},
		{"too many slots", func(c *localfleet.Config) { c.Slots = fleet.MaxSlots + 1 }, false},
		{"no health", func(c *localfleet.Config) { c.Health = fleet.HealthConfig{} }, false},
		{"an empty model", func(c *localfleet.Config) { c.Models = []string{model, " "} }, false},
		{"no clock", func(c *localfleet.Config) { c.Clock = nil }, false},
		{"models", func(c *localfleet.Config) { c.Models = []string{model} }, true},
	} {
		cfg := valid
		c.edit(&cfg)
		if err := cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
		if _, err := localfleet.New(cfg); (err == nil) != c.ok {
			t.Errorf("%s: New: %v", c.name, err)
		}
	}
	f := newFleet(t, nil, func(c *localfleet.Config) { c.Models = []string{model} })
	m := f.Models()
	m[0] = "changed"
	if got := f.Models(); !slices.Equal(got, []string{model}) {
		t.Errorf("models %v", got)
	}
	if got := newFleet(t, nil, nil).Models(); len(got) != 0 {
		t.Errorf("models %v, want none", got)
	}
}

// TestConcurrentReads: the router's goroutines read while events are
// applied and failures reported (run with -race).
func TestConcurrentReads(t *testing.T) {
	f := newFleet(t, nil, nil)
	now := time.Now()
	add(t, f, now, ident(urlA, model, bs), ident(urlB, model, bs))
	g := groupOf(t, f, urlA)
	p := toks(64, 1000)
	ch := chain(model, bs, "", p)
	var done atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000 && !done.Load(); i++ { // bounded, whatever happens
				m := f.Match(g, tier.GPU, ch)
				if n := m[urlA]; n != 0 && n != 2 && n != 4 {
					t.Errorf("matched %d blocks", n)
					return
				}
				_ = f.GroupEndpoints(g)
				_ = f.Endpoints()
				if i%100 == 0 {
					f.ReportFailure(urlB, "refused")
					f.SetLoad(urlB, fleet.Load{Running: float64(i)}, time.Now())
				}
				reads.Add(1)
			}
		}()
	}
	for i := 0; i < 300; i++ {
		h := uint64(1000 * (i + 1))
		evs := []kvevents.Event{stored(gpu, h, 0, "", p, bs)}
		if i%2 == 1 {
			evs = append(evs, removed(gpu, h+2, 2))
		}
		evs = append(evs, removed(gpu, h-1000, 4))
		if err := f.Update(urlA, batch(evs...), time.Now()); err != nil && !errors.Is(err, index.ErrUnresolvedParent) {
			t.Fatal(err)
		}
	}
	done.Store(true)
	wg.Wait()
	if reads.Load() == 0 {
		t.Fatal("no read ran")
	}
	if got := f.Match(g, tier.GPU, ch); !same(got, map[string]int{urlA: 2}) { // the last run lost its tail
		t.Errorf("at the end: %v", got)
	}
}
