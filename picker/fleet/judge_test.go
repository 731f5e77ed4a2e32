package fleet

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/tier"
)

func TestSidecarLostAndGrace(t *testing.T) {
	s := newState(t, 4)
	c := DefaultHealthConfig()
	t0 := time.Unix(5000, 0)
	if _, err := s.Register("s", []Identity{ident("http://a", "m"), ident("http://b", "m")}, nil, t0); err != nil {
		t.Fatal(err)
	}
	s.ApplyLoad("s", "http://a", Load{StreamState: StreamLive}, t0)
	s.ApplyLoad("s", "http://b", Load{EngineDown: true, EngineError: "refused"}, t0)
	if tr := s.Judge(t0, c); len(tr) != 1 || tr[0].Endpoint != "http://b" || tr[0].To.State != Down {
		t.Fatalf("first judgement: %+v", tr)
	}
	t1 := t0.Add(time.Second)
	s.LoseSidecar("s", t1)
	if got := s.Lost(); len(got) != 2 {
		t.Fatalf("lost %v", got)
	}
	tr := s.Judge(t1, c)
	if len(tr) != 1 || tr[0].Endpoint != "http://a" || tr[0].To.State != LoadOnly || !strings.Contains(tr[0].To.Reason, "sidecar is lost") {
		t.Fatalf("after the loss: %+v", tr)
	}
	// b's engine was reported down: a lost sidecar does not make it answer.
	if e := endpoint(t, s, "http://b"); e.HealthAt(t1, c).State != Down {
		t.Fatalf("b: %+v", e.HealthAt(t1, c))
	}
	s.EngineAnswered("http://a", false)
	if tr := s.Judge(t1.Add(time.Second), c); len(tr) != 1 || tr[0].To.State != Down {
		t.Fatalf("a's engine stopped answering: %+v", tr)
	}
	s.EngineAnswered("http://a", true)
	if tr := s.Judge(t1.Add(2*time.Second), c); len(tr) != 1 || tr[0].To.State != LoadOnly {
		t.Fatalf("a's engine answers again: %+v", tr)
	}
	// Time passing alone is no transition.
	if tr := s.Judge(t1.Add(3*time.Second), c); len(tr) != 0 {
		t.Fatalf("a quiet second: %+v", tr)
	}
	// Past the grace period both are dropped.
	tr = s.Judge(t1.Add(c.SidecarGrace+time.Second), c)
	if len(tr) != 2 || !tr[0].Dropped || !tr[1].Dropped || len(s.Endpoints()) != 0 {
		t.Fatalf("after the grace: %+v, %d left", tr, len(s.Endpoints()))
	}
}

// TestDrainThenLeave: a draining endpoint is out of routing at once, and
// goes with no grace period when its sidecar leaves; its neighbour whose
// sidecar was lost without a drain keeps the grace.
func TestDrainThenLeave(t *testing.T) {
	s := newState(t, 4)
	c := DefaultHealthConfig()
	t0 := time.Unix(5000, 0)
	mustRegister(t, s, "s", ident("http://a", "m"))
	mustRegister(t, s, "s2", ident("http://b", "m"))
	s.ApplyLoad("s", "http://a", Load{StreamState: StreamLive}, t0)
	s.ApplyLoad("s2", "http://b", Load{StreamState: StreamLive}, t0)
	if tr := s.Judge(t0, c); len(tr) != 0 {
		t.Fatalf("first judgement: %+v", tr)
	}
	s.ApplyLoad("s", "http://a", Load{StreamState: StreamLive, Draining: true, DrainReason: "SIGTERM"}, t0.Add(100*time.Millisecond))
	tr := s.Judge(t0.Add(100*time.Millisecond), c)
	if len(tr) != 1 || tr[0].Endpoint != "http://a" || tr[0].To.State != Draining || tr[0].To.Routable() || !strings.Contains(tr[0].To.Reason, "SIGTERM") {
		t.Fatalf("after the announcement: %+v", tr)
	}
	t1 := t0.Add(time.Second)
	s.LoseSidecar("s", t1)
	s.LoseSidecar("s2", t1)
	tr = s.Judge(t1, c)
	if len(tr) != 2 || tr[0].Endpoint != "http://a" || !tr[0].Dropped || !strings.Contains(tr[0].To.Reason, "drain") ||
		tr[1].Endpoint != "http://b" || tr[1].Dropped || tr[1].To.State != LoadOnly {
		t.Fatalf("after both sidecars left: %+v", tr)
	}
	if eps := s.Endpoints(); len(eps) != 1 || eps[0].URL != "http://b" {
		t.Fatalf("left: %+v", eps)
	}
}

func TestSidecarReturnsWithinGrace(t *testing.T) {
	s := newState(t, 4)
	c := DefaultHealthConfig()
	t0 := time.Unix(5000, 0)
	mustRegister(t, s, "s", ident("http://a", "m"))
	s.LoseSidecar("s", t0)
	if _, err := s.Register("s2", []Identity{ident("http://a", "m")}, func(string) bool { return false }, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	e := endpoint(t, s, "http://a")
	if !e.SidecarLost.IsZero() || e.Sidecar != "s2" {
		t.Fatalf("a new sidecar did not take the endpoint back: %+v", e)
	}
	if tr := s.Judge(t0.Add(c.SidecarGrace+time.Minute), c); len(tr) == 0 || tr[0].Dropped {
		t.Fatalf("a taken-back endpoint was dropped: %+v", tr)
	}
}

func TestEjection(t *testing.T) {
	s := newState(t, 4)
	c := DefaultHealthConfig()
	t0 := time.Unix(5000, 0)
	mustRegister(t, s, "s", ident("http://a", "m"))
	s.ApplyLoad("s", "http://a", Load{}, t0)
	if !s.Failed("http://a", t0, "connection refused", c) {
		t.Fatal("not ejected")
	}
	if s.Failed("http://a", t0.Add(10*time.Millisecond), "again", c) {
		t.Fatal("ejected twice while its backoff runs")
	}
	e := endpoint(t, s, "http://a")
	if h := e.HealthAt(t0, c); h.State != Down || !strings.Contains(h.Reason, "connection refused") || !e.EjectedUntil.Equal(t0.Add(c.EjectBase)) {
		t.Fatalf("ejected: %+v %+v", h, e)
	}
	if due := s.ProbeDue(t0.Add(c.EjectBase / 2)); len(due) != 0 {
		t.Fatalf("probe due during the backoff: %v", due)
	}
	t1 := t0.Add(c.EjectBase)
	if due := s.ProbeDue(t1); len(due) != 1 {
		t.Fatalf("no probe due after the backoff: %v", due)
	}
	e = endpoint(t, s, "http://a")
	if h := e.HealthAt(t1, c); h.State != Down || !strings.Contains(h.Reason, "probe") {
		t.Fatalf("back before a probe: %+v", h)
	}
	s.Probed("http://a", false, t1, "probe refused", c) // still failing: twice the backoff
	if e := endpoint(t, s, "http://a"); !e.Ejected || !e.EjectedUntil.Equal(t1.Add(2*c.EjectBase)) {
		t.Fatalf("failed probe: %+v", e)
	}
	t2 := t1.Add(2 * c.EjectBase)
	s.Probed("http://a", true, t2, "", c)
	e = endpoint(t, s, "http://a")
	if h := e.HealthAt(t2, c); h.State == Down {
		t.Fatalf("not readmitted: %+v", h)
	}
	// Failing again soon: the backoff keeps doubling; after staying in for
	// EjectMax it starts over.
	s.Failed("http://a", t2.Add(time.Second), "refused", c)
	if e := endpoint(t, s, "http://a"); !e.EjectedUntil.Equal(t2.Add(time.Second + 4*c.EjectBase)) {
		t.Fatalf("backoff did not grow: until %v", e.EjectedUntil.Sub(t2))
	}
	t3 := t2.Add(time.Second + 4*c.EjectBase)
	s.Probed("http://a", true, t3, "", c)
	late := t3.Add(c.EjectMax + time.Second)
	s.Failed("http://a", late, "refused", c)
	if e := endpoint(t, s, "http://a"); !e.EjectedUntil.Equal(late.Add(c.EjectBase)) {
		t.Fatalf("backoff did not start over: %v", e.EjectedUntil.Sub(late))
	}
	// Capped at EjectMax.
	for i := 0; i < 10; i++ {
		now := late.Add(time.Duration(i+1) * time.Hour)
		s.Probed("http://a", false, now, "refused", c)
	}
	if e := endpoint(t, s, "http://a"); e.EjectedUntil.Sub(late.Add(10*time.Hour)) > c.EjectMax {
		t.Fatalf("backoff past the cap: %v", e.EjectedUntil.Sub(late.Add(10*time.Hour)))
	}
	if s.Failed("http://nobody", t0, "x", c) {
		t.Fatal("ejected an unknown endpoint")
	}
}

// TestEjectionForgottenOnNewEpoch: an engine restarted (its sidecar's
// snapshot of a new epoch) is probed at once and backs off from EjectBase
// again, where its predecessor's failures had doubled the backoff twice;
// a snapshot of the same epoch (a resync) changes nothing.
func TestEjectionForgottenOnNewEpoch(t *testing.T) {
	s := newState(t, 4)
	c := DefaultHealthConfig()
	t0 := time.Unix(5000, 0)
	mustRegister(t, s, "s", ident("http://a", "m"))
	start := func(epoch uint64, now time.Time) {
		t.Helper()
		if l, err := s.StartSnapshot("s", "http://a", tier.GPU, epoch, summaryOf().Snapshot(), now); err != nil || l == nil {
			t.Fatalf("StartSnapshot: %v, %v", l, err)
		} else if done, err := l.Step(1 << 20); !done || err != nil {
			t.Fatalf("Step: %v, %v", done, err)
		}
	}
	start(7, t0)
	s.Failed("http://a", t0, "refused", c)
	now := t0
	for i := 0; i < 2; i++ { // two failed probes: 4 × EjectBase now
		now = endpoint(t, s, "http://a").EjectedUntil
		s.Probed("http://a", false, now, "refused", c)
	}
	until := endpoint(t, s, "http://a").EjectedUntil
	if got := until.Sub(now); got != 4*c.EjectBase {
		t.Fatalf("backoff after two failed probes %v, want %v", got, 4*c.EjectBase)
	}

	resync := now.Add(time.Second)
	start(7, resync) // the same engine: nothing changes
	if e := endpoint(t, s, "http://a"); !e.EjectedUntil.Equal(until) || len(s.ProbeDue(resync)) != 0 {
		t.Fatalf("a snapshot of the same epoch ended the ejection: until %v, due %v", e.EjectedUntil, s.ProbeDue(resync))
	}

	restarted := resync.Add(time.Second)
	start(8, restarted)
	if due := s.ProbeDue(restarted); !slices.Equal(due, []string{"http://a"}) {
		t.Fatalf("the restarted engine is not due for its probe at once: %v", due)
	}
	if e := endpoint(t, s, "http://a"); e.HealthAt(restarted, c).State != Down {
		t.Fatalf("readmitted without a probe: %+v", e.HealthAt(restarted, c))
	}
	s.Probed("http://a", true, restarted, "", c)
	if e := endpoint(t, s, "http://a"); e.HealthAt(restarted, c).State == Down {
		h := e.HealthAt(restarted, c)
		t.Fatalf("not readmitted by its probe: %+v", h)
	}
	again := restarted.Add(time.Second) // failing soon after: the history is the new engine's
	s.Failed("http://a", again, "refused", c)
	if got := endpoint(t, s, "http://a").EjectedUntil.Sub(again); got != c.EjectBase {
		t.Fatalf("the restarted engine's first ejection backs off %v, want %v", got, c.EjectBase)
	}
}

func TestRecordLag(t *testing.T) {
	s := newState(t, 4)
	mustRegister(t, s, "s", ident("http://a", "m"))
	for _, ms := range []int{5, 100, 7, 6, 8} {
		s.RecordLag("http://a", time.Duration(ms)*time.Millisecond)
	}
	if got := endpoint(t, s, "http://a").Lag; got != 7*time.Millisecond {
		t.Fatalf("median lag %v", got)
	}
	for i := 0; i < 40; i++ {
		s.RecordLag("http://a", time.Second)
	}
	if got := endpoint(t, s, "http://a").Lag; got != time.Second {
		t.Fatalf("the ring kept old lags: %v", got)
	}
	s.RecordLag("http://nobody", time.Second) // ignored
}

func endpoint(t *testing.T, s *State, url string) Endpoint {
	t.Helper()
	for _, e := range s.Endpoints() {
		if e.URL == url {
			return e
		}
	}
	t.Fatalf("no endpoint %s", url)
	return Endpoint{}
}
