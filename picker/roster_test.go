package picker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker"
	fleetpkg "github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/localfleet"
)

// rosterFleet is a router over an in-process fleet not in sync (each
// endpoint as fresh as its last load report), both on clock, with the
// endpoints urls of the model "sim" (nothing listens at them), each
// holding the keys holds gives it and a load report at clock's now.
func rosterFleet(t testing.TB, clock *manualClock, urls []string, holds map[string][]blockkey.Key) (*picker.Router, *localfleet.Fleet) {
	t.Helper()
	params := summary.ForCapacity(1024)
	cfg := localfleet.DefaultConfig()
	cfg.Params, cfg.InSync, cfg.Clock = params, false, clock.now
	lf, err := localfleet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range urls {
		addHolding(t, lf, params, u, holds[u], clock.now())
	}
	rcfg := picker.DefaultConfig()
	rcfg.Clock = clock.now
	r, err := picker.NewRouter(rcfg, lf, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, lf
}

// addHolding registers url with a summary of keys and a load report, at
// now.
func addHolding(t testing.TB, lf *localfleet.Fleet, params summary.Params, url string, keys []blockkey.Key, now time.Time) {
	t.Helper()
	id := fleetpkg.Identity{Endpoint: url, Model: "sim", BlockSize: 16, NumGPUBlocks: 4096, KeyFormat: blockkey.FormatV1,
		SummaryParams: params.String(), TokenizerFingerprint: "test"}
	if err := lf.Register(id, now); err != nil {
		t.Fatal(err)
	}
	c := summary.NewCounting(params)
	for _, k := range keys {
		c.Add(k)
	}
	c.TakeDelta()
	snap := c.Snapshot()
	if err := lf.Receive(localfleet.Update{Endpoint: url, Tier: tier.GPU, Epoch: 1, Snapshot: &snap}, now); err != nil {
		t.Fatal(err)
	}
	lf.SetLoad(url, fleetpkg.Load{}, now)
}

// TestDecisionSeesChangeAtOnce: what the fleet records — a load report,
// an ejection, a new endpoint — is in the very next decision, at the
// same instant, though decisions read a roster shared between changes.
func TestDecisionSeesChangeAtOnce(t *testing.T) {
	clock := &manualClock{}
	clock.set(time.Unix(1_000_000, 0))
	prompt := make([]uint32, 1024)
	for i := range prompt {
		prompt[i] = uint32(7 + i)
	}
	chain := (&blockkey.Request{Tokens: prompt, CacheSalt: "s"}).AppendKeys(nil, "sim", 16)
	const a, b, c = "http://127.0.0.1:9", "http://127.0.0.2:9", "http://127.0.0.3:9"
	r, lf := rosterFleet(t, clock, []string{a, b}, map[string][]blockkey.Key{a: chain})
	body := tokenBodyFor("sim", prompt, "s")
	pick := func(opt picker.PickOptions) string {
		t.Helper()
		p, err := r.Route(context.Background(), intake.Tokens, body, opt)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(p)
		return p.Endpoint
	}
	if got := pick(picker.PickOptions{}); got != a {
		t.Fatalf("with the prefix cached on %s, chose %s", a, got)
	}
	now := clock.now()
	lf.SetLoad(a, fleetpkg.Load{Waiting: 500, Running: 8}, now)
	if got := pick(picker.PickOptions{}); got != b {
		t.Fatalf("after %s reported 500 waiting, chose %s", a, got)
	}
	lf.SetLoad(a, fleetpkg.Load{}, now)
	if got := pick(picker.PickOptions{}); got != a {
		t.Fatalf("after %s reported its queue gone, chose %s", a, got)
	}
	lf.ReportFailure(a, "refused")
	if got := pick(picker.PickOptions{}); got != b {
		t.Fatalf("after %s was ejected, chose %s", a, got)
	}
	addHolding(t, lf, summary.ForCapacity(1024), c, chain, now)
	if got := pick(picker.PickOptions{Only: map[string]bool{c: true}}); got != c {
		t.Fatalf("the endpoint just added is not routable: chose %s", got)
	}
	if got := pick(picker.PickOptions{}); got != c {
		t.Fatalf("the endpoint just added, holding the prefix, not chosen: %s", got)
	}
}

// TestDecisionsWhileRostersRebuild: many goroutines decide while the
// fleet's endpoints report loads (5 between two decisions), are ejected
// and readmitted, and come and go, so that the group's roster is rebuilt
// under them all along (run with -race). Every decision chooses an
// endpoint of the group, and the decisions over one snapshot agree.
func TestDecisionsWhileRostersRebuild(t *testing.T) {
	clock := &manualClock{}
	clock.set(time.Unix(1_000_000, 0))
	var urls []string
	for i := range 32 {
		urls = append(urls, fmt.Sprintf("http://127.0.1.%d:9", i+1))
	}
	prompts := randomPrompts(8, 1024)
	holds := map[string][]blockkey.Key{}
	for i, p := range prompts {
		chain := (&blockkey.Request{Tokens: p, CacheSalt: "s"}).AppendKeys(nil, "sim", 16)
		holds[urls[i]] = chain[:16+6*i]
	}
	r, lf := rosterFleet(t, clock, urls, holds)
	extra := "http://127.0.2.1:9"
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // the fleet: load reports, ejections, an endpoint coming and going
		rng := rand.New(rand.NewPCG(9, 9))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			now := clock.advance(100 * time.Microsecond)
			for range 5 {
				lf.SetLoad(urls[rng.IntN(len(urls))], fleetpkg.Load{Waiting: float64(rng.IntN(4)), Running: float64(rng.IntN(8))}, now)
			}
			switch i % 64 {
			case 0:
				lf.ReportFailure(urls[rng.IntN(len(urls))], "refused")
			case 16:
				lf.Probe(now.Add(time.Minute), func(string) bool { return true })
			case 32:
				addHolding(t, lf, summary.ForCapacity(1024), extra, nil, now)
			case 48:
				lf.Remove(extra)
			}
		}
	})
	member := map[string]bool{extra: true}
	for _, u := range urls {
		member[u] = true
	}
	var deciders sync.WaitGroup
	for g := range 6 {
		deciders.Go(func() {
			ctx := context.Background()
			for i := range 150 {
				body := tokenBodyFor("sim", prompts[(g+i)%len(prompts)], "s")
				p, err := r.Prepare(ctx, intake.Tokens, body)
				if err != nil {
					t.Error(err)
					return
				}
				now := clock.now()
				snap := r.Snapshot(p, picker.PickOptions{}, now)
				one, err1 := r.Decide(p, snap, picker.PickOptions{}, now)
				two, err2 := r.Decide(p, snap, picker.PickOptions{}, now)
				if err1 != nil || err2 != nil {
					t.Error(err1, err2)
					return
				}
				if !member[one.Endpoint] || one.Endpoint != two.Endpoint || one.Reason != two.Reason {
					t.Errorf("decided %s (%s), then %s (%s) over one snapshot", one.Endpoint, one.Reason, two.Endpoint, two.Reason)
					return
				}
				if !slices.IsSortedFunc(snap.Group(), func(x, y *fleetpkg.Endpoint) int {
					if x.URL < y.URL {
						return -1
					}
					return 1
				}) {
					t.Error("the snapshot's endpoints are not sorted by URL")
					return
				}
			}
		})
	}
	deciders.Wait()
	close(stop)
	wg.Wait()
}
