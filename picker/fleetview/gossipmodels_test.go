package fleetview_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// member joins gossip on 127.0.0.1 (a free port) as name, advertising meta.
func member(t *testing.T, name, join string, meta gossip.Meta) *gossip.Members {
	t.Helper()
	cfg := gossip.LocalConfig(name)
	if join != "" {
		cfg.Join = []string{join}
	}
	m, err := gossip.New(cfg, meta, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Kill() })
	return m
}

// metaSettles bounds the wait for a member's changed metadata to reach
// the view: its broadcast normally arrives in well under a second, but
// one lost on a loaded machine (UDP) is repaired only by the next
// push-pull, every 15 s in gossip.LocalConfig, and the view's reconcile
// (2 s) must see it after that.
const metaSettles = 40 * time.Second

// endpointURLs lists the view's endpoints' URLs.
func endpointURLs(v *fleetview.View) []string {
	var out []string
	for _, e := range v.Endpoints() {
		out = append(out, e.URL)
	}
	return out
}

// TestGossipModelsNotDialled (issue 37): a view following only model a
// over real gossip never dials a sidecar whose metadata advertises model
// b — no Info, no summary stream — counts it and says so at debug level
// only; it dials one that advertises no models (an older sidecar) and
// asks it, as before; it follows a member once its metadata advertises
// a (b's engine redeployed with a), and drops one at once whose metadata
// stops advertising a (a's engine redeployed with c).
func TestGossipModelsNotDialled(t *testing.T) {
	params := summary.ForCapacity(1024)
	a := simsidecar.Start(t, simsidecar.Config{Index: 0, Params: params, Model: "a"})
	b := simsidecar.Start(t, simsidecar.Config{Index: 1, Params: params, Model: "b"})
	old := simsidecar.Start(t, simsidecar.Config{Index: 2, Params: params, Model: "b"})
	side := func(s *simsidecar.Sidecar, models ...string) gossip.Meta {
		return gossip.Meta{Role: gossip.RoleSidecar, GRPC: s.Addr(), Models: models}
	}
	ma := member(t, "sidecar-a", "", side(a, "a"))
	seed := ma.LocalAddr()
	mb := member(t, "sidecar-b", seed, side(b, "b"))
	member(t, "sidecar-old", seed, side(old)) // the old form: no models

	cfg := viewConfig(params, 20*time.Millisecond)
	cfg.Models = []string{"a"}
	cfg.Health.SidecarGrace = time.Hour // a lost sidecar's endpoints would linger: dropping a's must not wait for it
	core, logs := observer.New(zapcore.DebugLevel)
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(cfg, zap.New(core), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	pm := member(t, "picker", seed, gossip.Meta{Role: gossip.RolePicker})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.FollowGossip(ctx, pm)

	skipped := func() float64 { return gaugeValue(t, reg, "kvroute_picker_sidecars_skipped_for_model") }
	testnet.Await(t, 15*time.Second, 10*time.Millisecond, func() error {
		if a.Watches() < 1 || old.Infos() < 1 || skipped() != 1 || !slices.Equal(endpointURLs(v), []string{a.Endpoint()}) {
			return fmt.Errorf("a's streams %d, old's Info calls %d, skipped %v, endpoints %v", a.Watches(), old.Infos(), skipped(), endpointURLs(v))
		}
		return nil
	})
	if b.Infos() != 0 || b.Watches() != 0 {
		t.Errorf("b (advertising model b): %d Info calls, %d streams; want never dialled", b.Infos(), b.Watches())
	}
	if old.Watches() != 0 {
		t.Errorf("old (no models advertised, serving b): %d streams, want asked only", old.Watches())
	}
	debug, louder := 0, 0
	for _, e := range logs.All() {
		if !strings.Contains(fmt.Sprint(e.ContextMap()), b.Addr()) {
			continue
		}
		if e.Level == zapcore.DebugLevel && strings.Contains(e.Message, "not dialled") {
			debug++
		} else if e.Level > zapcore.DebugLevel {
			louder++
			t.Errorf("a line above debug about b: %s %s %v", e.Level, e.Message, e.ContextMap())
		}
	}
	if debug != 1 {
		t.Errorf("%d debug lines saying b is not dialled, want 1", debug)
	}

	// b's engine redeployed with model a: its member advertises a (and its
	// new sidecar's address); the view follows it.
	b2 := simsidecar.Start(t, simsidecar.Config{Index: 3, Params: params, Model: "a"})
	if err := mb.SetMeta(side(b2, "a")); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, metaSettles, 10*time.Millisecond, func() error {
		if eps := endpointURLs(v); b2.Watches() < 1 || skipped() != 0 || !slices.Contains(eps, b2.Endpoint()) {
			return fmt.Errorf("b2's streams %d, skipped %v, endpoints %v", b2.Watches(), skipped(), eps)
		}
		return nil
	})

	// a's engine redeployed with model c, at the same address: the view
	// stops following it, and its endpoint goes at once.
	if err := ma.SetMeta(side(a, "c")); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, metaSettles, 10*time.Millisecond, func() error {
		if eps := endpointURLs(v); skipped() != 1 || !slices.Equal(eps, []string{b2.Endpoint()}) {
			return fmt.Errorf("skipped %v, endpoints %v; want b2's only", skipped(), eps)
		}
		return nil
	})
	if b.Infos() != 0 || b.Watches() != 0 {
		t.Errorf("b's first sidecar: %d Info calls, %d streams; want never dialled", b.Infos(), b.Watches())
	}
}
