package picker

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/picker/admit"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
)

// advance moves a synctest bubble's fake clock on by d (no real time
// passes: the bubble's goroutines run until all are blocked, then its
// clock jumps) and waits until every goroutine in the bubble is blocked
// again, so what d brings about has happened.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// fakeLoads is a group's load the test sets: saturated or not.
type fakeLoads struct {
	mu  sync.Mutex
	sat bool
}

func (f *fakeLoads) set(sat bool) {
	f.mu.Lock()
	f.sat = sat
	f.mu.Unlock()
}

func (f *fakeLoads) load(string, []*fleet.Endpoint, time.Time) []admit.Load {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sat {
		return []admit.Load{{Queued: 100}}
	}
	return []admit.Load{{}}
}

type admitResult struct {
	leave func()
	err   error
}

// testAdmission is an admission shell over fake loads, with its metrics
// and logs.
func testAdmission(t *testing.T, cfg admit.Config) (*admission, *fakeLoads, *prometheus.Registry, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	fl := &fakeLoads{}
	a := newAdmission(cfg, zap.New(core), reg, fl.load)
	t.Cleanup(a.close)
	return a, fl, reg, logs
}

// enterAsync enters in a goroutine; the result arrives on the channel.
func enterAsync(a *admission, ctx context.Context, f Fairness, salt string, cost float64) chan admitResult {
	ch := make(chan admitResult, 1)
	go func() {
		leave, _, err := a.enter(ctx, "g", "m", nil, f, salt, cost, false)
		ch <- admitResult{leave, err}
	}()
	return ch
}

func code(err error) string {
	var ie *intake.Error
	if errors.As(err, &ie) {
		return ie.Code
	}
	return ""
}

func TestAdmissionDirect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _, reg, _ := testAdmission(t, admit.DefaultConfig())
		leave, waited, err := a.enter(t.Context(), "g", "m", nil, Fairness{}, "", 10, false)
		if err != nil || waited != 0 {
			t.Fatalf("enter on an idle group: waited %v, %v", waited, err)
		}
		leave()
		if got := testutil.ToFloat64(a.results.WithLabelValues("shared", admitDirect)); got != 1 {
			t.Fatalf("admitted = %v, want 1", got)
		}
		// Only the shared key's series, at 0: it exists from the start for
		// the dashboard; a key gets its own once it queues.
		if n, _ := testutil.GatherAndCount(reg, "kvroute_picker_queue_depth"); n != 1 || testutil.ToFloat64(a.depth.WithLabelValues("shared")) != 0 {
			t.Fatalf("queue depth with nobody queued: %d series, shared %v", n, testutil.ToFloat64(a.depth.WithLabelValues("shared")))
		}
	})
}

// TestAdmissionReleaseOrder: while the group is saturated requests wait;
// once it has room they go one at a time, each after the previous one's
// pick is recorded, the light tenant before the heavy tenant's second.
func TestAdmissionReleaseOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, fl, reg, logs := testAdmission(t, admit.DefaultConfig())
		fl.set(true)
		heavy := Fairness{Tenant: "heavy"}
		h1 := enterAsync(a, t.Context(), heavy, "", 100)
		synctest.Wait()
		h2 := enterAsync(a, t.Context(), heavy, "", 100)
		synctest.Wait()
		light := enterAsync(a, t.Context(), Fairness{}, "s3cret-salt", 100)
		synctest.Wait()
		select {
		case r := <-h1:
			t.Fatalf("released while saturated: %+v", r)
		default:
		}
		if got := testutil.ToFloat64(a.depth.WithLabelValues("tenant:heavy")); got != 2 {
			t.Fatalf("queue depth of tenant:heavy = %v, want 2", got)
		}
		if st := a.snapshot(); len(st) != 1 || !st[0].Saturated || st[0].Waiting != 3 {
			t.Fatalf("snapshot %+v, want one saturated group with 3 waiting", st)
		}
		if n := logs.FilterMessageSnippet("saturated").Len(); n != 1 {
			t.Fatalf("%d saturation log lines, want 1", n)
		}
		fl.set(false)
		var order []string
		for i := 0; i < 3; i++ {
			advance(admitTick)
			var got []string
			var leave func()
			for name, ch := range map[string]chan admitResult{"heavy1": h1, "heavy2": h2, "light": light} {
				select {
				case r := <-ch:
					if r.err != nil {
						t.Fatalf("%s: %v", name, r.err)
					}
					got, leave = append(got, name), r.leave
				default:
				}
			}
			if len(got) != 1 {
				t.Fatalf("release %d: %v went together, want one at a time", i, got)
			}
			order = append(order, got[0])
			advance(5 * admitTick) // its pick is being made: nobody else goes
			for _, ch := range []chan admitResult{h1, h2, light} {
				if len(ch) > 0 {
					t.Fatalf("release %d: another went before %s left", i, got[0])
				}
			}
			leave()
		}
		if got := strings.Join(order, " "); got != "heavy1 light heavy2" {
			t.Fatalf("released %s, want heavy1 light heavy2", got)
		}
		for _, l := range []string{"tenant:heavy", "salt:"} {
			found := false
			for _, s := range mustGather(t, reg) {
				if strings.Contains(s, l) {
					found = true
				}
				if strings.Contains(s, "s3cret") {
					t.Fatalf("a metric names the salt: %s", s)
				}
			}
			if !found {
				t.Fatalf("no metric labelled %s", l)
			}
		}
		if got := testutil.ToFloat64(a.results.WithLabelValues("tenant:heavy", admitQueued)); got != 2 {
			t.Fatalf("queued results of tenant:heavy = %v, want 2", got)
		}
		if n := logs.FilterMessageSnippet("no longer saturated").Len(); n != 1 {
			t.Fatalf("%d end-of-saturation log lines, want 1", n)
		}
	})
}

// mustGather is every series of reg in the text exposition format, one
// line each (what /metrics would show).
func mustGather(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		var b strings.Builder
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.Split(b.String(), "\n")...)
	}
	return out
}

func TestAdmissionRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := admit.DefaultConfig()
		cfg.QueueSize, cfg.QueueTimeout = 2, 10*time.Second
		a, fl, _, _ := testAdmission(t, cfg)
		fl.set(true)
		first := enterAsync(a, t.Context(), Fairness{Priority: 1}, "", 10)
		synctest.Wait()
		second := enterAsync(a, t.Context(), Fairness{Priority: 1}, "", 10)
		synctest.Wait()
		// Full of a higher band: a newcomer is shed, with Retry-After.
		_, _, err := a.enter(t.Context(), "g", "m", nil, Fairness{}, "", 10, false)
		var ie *intake.Error
		if !errors.As(err, &ie) || ie.Status != http.StatusTooManyRequests || ie.Type != "rate_limit_exceeded" || ie.Code != "queue_full" || ie.RetryAfter < time.Second {
			t.Fatalf("full queue: %#v, want 429 rate_limit_exceeded queue_full with a Retry-After", err)
		}
		// A newcomer of the band makes room: the oldest goes.
		third := enterAsync(a, t.Context(), Fairness{Priority: 1}, "", 10)
		synctest.Wait()
		if r := <-first; code(r.err) != "queue_displaced" {
			t.Fatalf("the oldest waiter got %v, want queue_displaced", r.err)
		}
		// The deadline passes: 429 queue_timeout.
		advance(cfg.QueueTimeout + admitTick)
		for name, ch := range map[string]chan admitResult{"second": second, "third": third} {
			r := <-ch
			if !errors.As(r.err, &ie) || ie.Code != "queue_timeout" || ie.Status != http.StatusTooManyRequests || ie.RetryAfter <= 0 {
				t.Fatalf("%s after the deadline: %v, want 429 queue_timeout", name, r.err)
			}
		}
		if got := testutil.ToFloat64(a.results.WithLabelValues("shared", admitExpired)); got != 2 {
			t.Fatalf("expired = %v, want 2", got)
		}
		if got := testutil.ToFloat64(a.depth.WithLabelValues("shared")); got != 0 {
			t.Fatalf("queue depth after all left = %v", got)
		}
	})
}

// TestAdmissionStanding: once the queue has stood for the standing
// timeout, the waiters that waited longer of a key ahead of its share are
// shed; a key with one waiter waits on for its turn; a waiter of a short
// burst is not shed.
func TestAdmissionStanding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := admit.DefaultConfig() // LIFO after 250 ms, standing timeout 1 s, queue timeout 5 s
		a, fl, _, _ := testAdmission(t, cfg)
		fl.set(true)
		start := time.Now()
		var heavy []chan admitResult
		for range 3 {
			heavy = append(heavy, enterAsync(a, t.Context(), Fairness{Tenant: "heavy"}, "", 10))
		}
		light := enterAsync(a, t.Context(), Fairness{Tenant: "light"}, "", 10)
		var ie *intake.Error
		for i, ch := range heavy {
			r := <-ch
			if !errors.As(r.err, &ie) || ie.Code != "queue_timeout" {
				t.Fatalf("heavy waiter %d in a standing queue got %v, want 429 queue_timeout", i, r.err)
			}
		}
		// Standing from 250 ms, for 1 s: shed at 1.25 s, long before 5 s.
		if d := time.Since(start); d < 1250*time.Millisecond || d > 1250*time.Millisecond+2*admitTick {
			t.Fatalf("shed after %v, want about 1.25 s", d)
		}
		advance(time.Second)
		fl.set(false) // room, before light's deadline: light was spared
		if r := <-light; r.err != nil {
			t.Fatalf("the light key's one waiter: %v", r.err)
		} else {
			r.leave()
		}
		// A burst: room comes within the standing timeout, the waiter goes.
		fl.set(true)
		w := enterAsync(a, t.Context(), Fairness{}, "", 10)
		advance(900 * time.Millisecond)
		fl.set(false)
		if r := <-w; r.err != nil {
			t.Fatalf("a waiter of a burst: %v", r.err)
		} else {
			r.leave()
		}
	})
}

func TestAdmissionAbandonedAndStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, fl, _, _ := testAdmission(t, admit.DefaultConfig())
		fl.set(true)
		ctx, cancel := context.WithCancel(t.Context())
		gone := enterAsync(a, ctx, Fairness{Tenant: "t"}, "", 10)
		stays := enterAsync(a, t.Context(), Fairness{Tenant: "t"}, "", 10)
		synctest.Wait()
		cancel()
		if r := <-gone; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("abandoned waiter: %v", r.err)
		}
		synctest.Wait()
		if got := testutil.ToFloat64(a.results.WithLabelValues("tenant:t", admitAbandoned)); got != 1 {
			t.Fatalf("abandoned = %v, want 1", got)
		}
		if st := a.snapshot(); st[0].Waiting != 1 {
			t.Fatalf("%d waiting after one left, want 1", st[0].Waiting)
		}
		a.close()
		r := <-stays
		var ie *intake.Error
		if !errors.As(r.err, &ie) || ie.Status != http.StatusServiceUnavailable || ie.Code != "shutting_down" {
			t.Fatalf("a waiter at shutdown got %v, want 503 shutting_down", r.err)
		}
		if leave, _, err := a.enter(t.Context(), "g", "m", nil, Fairness{}, "", 1, false); err != nil || leave == nil {
			t.Fatalf("after close: %v, want admitted at once", err)
		}
	})
}

// TestAdmissionStalledRelease: a released request that never reports its
// pick does not hold its group up for more than a second.
func TestAdmissionStalledRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, fl, _, _ := testAdmission(t, admit.DefaultConfig())
		fl.set(true)
		first := enterAsync(a, t.Context(), Fairness{}, "", 1)
		synctest.Wait()
		second := enterAsync(a, t.Context(), Fairness{}, "", 1)
		synctest.Wait()
		fl.set(false)
		start := time.Now()
		<-first // never leaves
		r := <-second
		if r.err != nil {
			t.Fatal(r.err)
		}
		if d := time.Since(start); d < time.Second || d > time.Second+3*admitTick {
			t.Fatalf("the next went after %v, want about 1 s", d)
		}
	})
}

func TestFairnessOf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hdr    map[string][]string
		want   Fairness
		errHas string
	}{
		{"none", nil, Fairness{}, ""},
		{"tenant and priority", map[string][]string{"X-Kvroute-Tenant": {"acme"}, "X-Kvroute-Priority": {"-3"}}, Fairness{Tenant: "acme", Priority: -3}, ""},
		{"tenant too long", map[string][]string{"X-Kvroute-Tenant": {strings.Repeat("a", 129)}}, Fairness{}, "invalid_tenant"},
		{"tenant with a space", map[string][]string{"X-Kvroute-Tenant": {"a b"}}, Fairness{}, "invalid_tenant"},
		{"two tenants", map[string][]string{"X-Kvroute-Tenant": {"a", "b"}}, Fairness{}, "invalid_tenant"},
		{"priority not a number", map[string][]string{"X-Kvroute-Priority": {"high"}}, Fairness{}, "invalid_priority"},
		{"priority out of range", map[string][]string{"X-Kvroute-Priority": {"101"}}, Fairness{}, "invalid_priority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, vs := range tc.hdr {
				for _, v := range vs {
					h.Add(k, v)
				}
			}
			got, err := fairnessOf(h, "x-kvroute-tenant")
			if tc.errHas != "" {
				var ie *intake.Error
				if !errors.As(err, &ie) || ie.Code != tc.errHas || ie.Status != http.StatusBadRequest {
					t.Fatalf("err %v, want 400 %s", err, tc.errHas)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("fairnessOf = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	k1, l1 := fairnessKey(Fairness{}, "salt-a")
	k2, _ := fairnessKey(Fairness{}, "salt-b")
	kt, lt := fairnessKey(Fairness{Tenant: "salt-a"}, "salt-a")
	ks, ls := fairnessKey(Fairness{}, "")
	if k1 == k2 || k1 == kt || strings.Contains(l1, "salt-a") || !strings.HasPrefix(l1, "salt:") || lt != "tenant:salt-a" || ks != "shared" || ls != "shared" {
		t.Fatalf("keys %q %q %q %q, labels %q %q %q", k1, k2, kt, ks, l1, lt, ls)
	}
}

// TestKeyLabelsCapped: past maxKeyLabels fairness keys, the metrics say
// "other".
func TestKeyLabelsCapped(t *testing.T) {
	a := &admission{labels: map[string]string{}}
	for i := 0; i < maxKeyLabels; i++ {
		k, l := fairnessKey(Fairness{Tenant: strings.Repeat("t", i+1)}, "")
		if got := a.labelOf(k, l); got != l {
			t.Fatalf("key %d labelled %q, want %q", i, got, l)
		}
	}
	k, l := fairnessKey(Fairness{Tenant: "late"}, "")
	if got := a.labelOf(k, l); got != "other" {
		t.Fatalf("the key past the cap labelled %q, want other", got)
	}
}

func TestRetryAfterHeader(t *testing.T) {
	w := httptest.NewRecorder()
	writeError(w, queueFull("m", 3, 2500*time.Millisecond))
	if got := w.Header().Get("Retry-After"); got != "3" {
		t.Fatalf("Retry-After %q, want 3 (rounded up)", got)
	}
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), `"type":"rate_limit_exceeded"`) {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	writeError(w, noEndpoints("m"))
	if w.Header().Get("Retry-After") != "" || w.Code != http.StatusServiceUnavailable {
		t.Fatalf("no endpoint: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
}

// TestAdmissionAhead: with --engine-priority, a request whose key is well
// within its share (ahead) passes a saturated group's queue at once,
// counted as ahead, while another waits; not once every endpoint has
// twice MaxWaiting queued (the engines' queues stay bounded).
func TestAdmissionAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := admit.DefaultConfig()
		var mu sync.Mutex
		load := admit.Load{PrefillTokens: 1e6, Queued: 1} // saturated by prefill in flight
		reg := prometheus.NewRegistry()
		a := newAdmission(cfg, zap.NewNop(), reg, func(string, []*fleet.Endpoint, time.Time) []admit.Load {
			mu.Lock()
			defer mu.Unlock()
			return []admit.Load{load}
		})
		t.Cleanup(a.close)
		heavy := enterAsync(a, t.Context(), Fairness{Tenant: "heavy"}, "", 10)
		synctest.Wait()
		select {
		case r := <-heavy:
			t.Fatalf("a saturated group admitted a request not ahead: %v", r.err)
		default:
		}
		leave, waited, err := a.enter(t.Context(), "g", "m", nil, Fairness{Tenant: "light"}, "", 10, true)
		if err != nil || waited != 0 {
			t.Fatalf("ahead: %v after %v, want admitted at once", err, waited)
		}
		leave()
		if n := testutil.ToFloat64(a.results.WithLabelValues("tenant:light", admitAhead)); n != 1 {
			t.Fatalf("ahead counted %v times", n)
		}
		// Every endpoint at twice the waiting limit: ahead waits too.
		mu.Lock()
		load.Queued = 2 * cfg.MaxWaiting
		mu.Unlock()
		light := enterAsync2(a, t.Context(), Fairness{Tenant: "light"}, true)
		synctest.Wait()
		select {
		case r := <-light:
			t.Fatalf("ahead past a full engine queue: %v", r.err)
		default:
		}
		mu.Lock()
		load = admit.Load{}
		mu.Unlock()
		a.poke()
		advance(2 * admitTick)
		for _, ch := range []chan admitResult{heavy, light} {
			if r := <-ch; r.err != nil {
				t.Fatal(r.err)
			} else {
				r.leave()
			}
			advance(2 * admitTick)
		}
	})
}

// enterAsync2 is enterAsync with ahead.
func enterAsync2(a *admission, ctx context.Context, f Fairness, ahead bool) chan admitResult {
	ch := make(chan admitResult, 1)
	go func() {
		leave, _, err := a.enter(ctx, "g", "m", nil, f, "", 10, ahead)
		ch <- admitResult{leave, err}
	}()
	return ch
}
