package fleetview_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestStaticSidecarsSurviveGossip: a view following gossip forgets a
// sidecar no member advertises (watched as gossip would), but keeps one
// the operator listed (--sidecars, WatchStatic) through every
// reconciliation: both pods here are outside gossip.
func TestStaticSidecarsSurviveGossip(t *testing.T) {
	listed := startPodWith(t, 0, "", podOptions{gpuBlocks: 2048, capacity: capacity})
	other := startPodWith(t, 1, "", podOptions{gpuBlocks: 2048, capacity: capacity})
	v, err := fleetview.New(viewConfig(summary.ForCapacity(capacity), 50*time.Millisecond), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	m, err := gossip.New(gossip.LocalConfig("static-picker"), gossip.Meta{Role: gossip.RolePicker}, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Kill() }()
	v.WatchStatic(listed.sidecar.GRPCAddr())
	v.Watch(other.sidecar.GRPCAddr())
	known := func() map[string]bool {
		out := map[string]bool{}
		for _, e := range v.Endpoints() {
			out[e.URL] = true
		}
		return out
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if k := known(); !k[listed.engine.URL()] || !k[other.engine.URL()] {
			return fmt.Errorf("endpoints known: %v", k)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.FollowGossip(ctx, m)
	// The unlisted sidecar is forgotten at the first reconciliation, and
	// its endpoint leaves after the grace period; the listed one stays.
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		if k := known(); k[other.engine.URL()] {
			return fmt.Errorf("the unlisted sidecar's endpoint is still known: %v", k)
		}
		return nil
	})
	if k := known(); !k[listed.engine.URL()] {
		t.Fatalf("the listed sidecar was forgotten by gossip's reconciliation: %v", k)
	}
	for _, e := range v.Endpoints() {
		if h := v.Health(&e); e.URL == listed.engine.URL() && h.State.String() != "cached" {
			t.Fatalf("the listed sidecar's endpoint is %s (%s)", h.State, h.Reason)
		}
	}
}
