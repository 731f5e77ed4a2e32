package picker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/picker/intake"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// gatedEngine is a real engine behind a proxy that counts render calls
// and holds each until release is closed.
type gatedEngine struct {
	srv     *httptest.Server
	renders atomic.Int32
	release chan struct{}
}

func startGatedEngine(t *testing.T, engineURL string) *gatedEngine {
	t.Helper()
	u, err := url.Parse(engineURL)
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedEngine{release: make(chan struct{})}
	rp := httputil.NewSingleHostReverseProxy(u)
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/render") || r.URL.Path == "/tokenize" {
			g.renders.Add(1)
			select {
			case <-g.release:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

// coalesceRouter is a router over one real pod, and the pod's endpoints
// with their URL pointing at a gated proxy of the engine.
func coalesceRouter(t *testing.T) (*Router, *prometheus.Registry, []*fleet.Endpoint, *gatedEngine) {
	t.Helper()
	vcfg := fleetview.DefaultConfig()
	vcfg.Params, vcfg.Retry = summary.ForCapacity(4096), 50*time.Millisecond
	v, err := fleetview.New(vcfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	p := testpod.Start(t, testpod.Options{Capacity: 4096, Scrape: 50 * time.Millisecond})
	v.Watch(p.Sidecar.GRPCAddr())
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if eps := v.Endpoints(); len(eps) < 1 || !eps[0].HasLoad() {
			return errors.New("the view knows no loaded endpoint")
		}
		return nil
	})
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.TokenizeTimeout = time.Minute // the gate holds renders while requests gather
	r, err := NewRouter(cfg, v, zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	g := startGatedEngine(t, p.Engine.URL())
	var eps []*fleet.Endpoint
	for _, e := range v.Endpoints() {
		e.URL = g.srv.URL
		eps = append(eps, &e)
	}
	return r, reg, eps, g
}

// Concurrent identical chat requests cost one render call, and all get
// the tokens an uncoalesced render gives; the counter counts the joiners.
func TestRenderCoalescedAcrossRequests(t *testing.T) {
	r, reg, eps, g := coalesceRouter(t)
	body := []byte(`{"model":"` + eps[0].Info.Model + `","messages":[{"role":"system","content":"` +
		strings.Repeat("You are a careful assistant. ", 40) + `"},{"role":"user","content":"What is the capital of France?"}]}`)
	req, err := r.parser.Parse(intake.Chat, body)
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	calls := 1 // the full render, and the anchor's when it has one
	if req.AnchorBody != nil {
		calls = 2
	}
	got := make([]tokensOf, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var nt notes
			got[i], errs[i] = r.tokens(context.Background(), req, intake.Chat, body, fleet.NewRoster(eps), &nt)
		})
	}
	// Release the engine once every request but the first has joined.
	var released sync.Once
	release := func() { released.Do(func() { close(g.release) }) }
	t.Cleanup(func() { release(); wg.Wait() }) // on a failed wait too
	testnet.Await(t, 10*time.Second, time.Millisecond, func() error {
		if got := testutil.ToFloat64(r.m.coalesced); got < float64(calls*(n-1)) {
			return fmt.Errorf("%v of %d renders joined", got, calls*(n-1))
		}
		return nil
	})
	release()
	wg.Wait()
	if int(g.renders.Load()) != calls {
		t.Fatalf("%d render calls for %d identical requests, want %d", g.renders.Load(), n, calls)
	}
	want, err := r.render.Render(context.Background(), g.srv.URL, intake.Chat, body)
	if err != nil || len(want.TokenIDs) == 0 {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] != nil || !slices.Equal(got[i].full, want.TokenIDs) || got[i].anchor != got[0].anchor {
			t.Fatalf("request %d: %v, %d tokens (anchor %d); want %d tokens (anchor %d)", i, errs[i], len(got[i].full), got[i].anchor, len(want.TokenIDs), got[0].anchor)
		}
	}
	got[0].full[0]++ // the requests share no token memory
	if got[1].full[0] != want.TokenIDs[0] {
		t.Fatal("coalesced requests share token ids")
	}
	if r.coal.InFlight() != 0 {
		t.Fatalf("%d renders left in flight", r.coal.InFlight())
	}
	if v := testutil.ToFloat64(r.m.coalesced); v != float64(calls*(n-1)) {
		t.Fatalf("coalesced_total %v, want %d", v, calls*(n-1))
	}
	if c, err := testutil.GatherAndCount(reg, "kvroute_picker_render_coalesced_total"); err != nil || c != 1 {
		t.Fatalf("the counter is not registered: %d %v", c, err)
	}
}

// A request whose client leaves does not fail the identical ones that
// joined its render.
func TestRenderCoalescedLeaderLeaves(t *testing.T) {
	r, _, eps, g := coalesceRouter(t)
	body := []byte(`{"model":"` + eps[0].Info.Model + `","messages":[{"role":"user","content":"leader leaves"}]}`)
	req, err := r.parser.Parse(intake.Chat, body)
	if err != nil {
		t.Fatal(err)
	}
	calls := int32(1) // the full render, and the anchor's when it has one
	if req.AnchorBody != nil {
		calls = 2
	}
	lctx, cancel := context.WithCancel(context.Background())
	leader := make(chan error, 1)
	go func() {
		var nt notes
		_, err := r.tokens(lctx, req, intake.Chat, body, fleet.NewRoster(eps), &nt)
		leader <- err
	}()
	testnet.Await(t, 10*time.Second, time.Millisecond, func() error {
		if g.renders.Load() < calls {
			return errors.New("no render call")
		}
		return nil
	})
	waiter := make(chan tokensOf, 1)
	go func() {
		var nt notes
		toks, err := r.tokens(context.Background(), req, intake.Chat, body, fleet.NewRoster(eps), &nt)
		if err != nil {
			t.Error(err)
		}
		waiter <- toks
	}()
	testnet.Await(t, 10*time.Second, time.Millisecond, func() error {
		if testutil.ToFloat64(r.m.coalesced) < float64(calls) {
			return errors.New("the second request did not join")
		}
		return nil
	})
	cancel()
	if err := <-leader; err == nil {
		t.Fatal("the leader's client left, and it got tokens")
	}
	close(g.release)
	if toks := <-waiter; len(toks.full) == 0 {
		t.Fatal("the waiter got no tokens after its leader left")
	}
	if g.renders.Load() != calls {
		t.Fatalf("%d render calls, want %d", g.renders.Load(), calls)
	}
}
