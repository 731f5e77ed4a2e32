package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvroute/kvroute/internal/summary"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/sidecar"
)

// TestResumeAcrossSidecarRestart: a picker holding a position from an
// earlier sidecar process gets a snapshot, not deltas against another base.
func TestResumeAcrossSidecarRestart(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	cfg := sidecarConfig(e)
	key := e.URL() + "|GPU"
	dial := func(addr string) pb.SidecarClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return pb.NewSidecarClient(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := sidecar.Start(context.Background(), cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{t: t, params: cfg.Params(), snaps: map[string]*summary.Snapshot{}, epochs: map[string]uint64{}}
	st, err := dial(a.GRPCAddr()).WatchSummaries(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	complete(t, e, prompt(64, 1000), "")
	converged(t, a, e, 0)
	r.follow(st, func() bool { s := r.snaps[key]; return s != nil && s.Seq >= 1 })
	pos := r.known()
	a.Close()
	for i := 0; i < 6; i++ {
		complete(t, e, prompt(64, 20000+1000*i), "")
	}
	b := startSidecar(t, cfg)
	converged(t, b, e, 0)
	for i := 0; i < 4; i++ { // four deltas: b's seqs pass the old position's
		before := b.State()[0].DeltaSeq["GPU"]
		complete(t, e, prompt(64, 50000+1000*i), "")
		converged(t, b, e, 0)
		deltaTaken(t, b, 0, before)
	}
	cb := dial(b.GRPCAddr())
	st2, err := cb.WatchSummaries(ctx, &pb.WatchRequest{Known: pos})
	if err != nil {
		t.Fatal(err)
	}
	r.kinds = nil
	r.follow(st2, func() bool { return r.loads > 2 })
	if !slices.Contains(r.kinds, "snapshot") {
		t.Fatalf("resumed across a sidecar restart without a snapshot: %v", r.kinds)
	}
	fresh := &replica{t: t, params: cfg.Params(), snaps: map[string]*summary.Snapshot{}, epochs: map[string]uint64{}}
	st3, err := cb.WatchSummaries(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fresh.follow(st3, func() bool { return fresh.snaps[key] != nil })
	r.follow(st2, func() bool { return r.snaps[key].Seq >= fresh.snaps[key].Seq })
	if r.snaps[key].Seq == fresh.snaps[key].Seq && !slices.Equal(r.snaps[key].Words, fresh.snaps[key].Words) {
		t.Fatal("the resumed picker's bitmap differs from the sidecar's")
	}
}

// TestUnknownTiersAreNotCreated: neither a debug lookup nor an event with
// an unknown medium creates a tier.
func TestUnknownTiersAreNotCreated(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	s := startSidecar(t, sidecarConfig(e))
	for i := 0; i < 20; i++ {
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/keys?canonical=0000000000000001&tier=junk%d", s.DebugAddr(), i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if n := len(s.State()[0].Summary); n != 0 {
		t.Fatalf("%d tiers created by lookups", n)
	}
}

// TestStartFailsWhenIntakeCannotOpen: a SUB that cannot bind fails Start
// with the reason, instead of a sidecar that silently follows nothing.
func TestStartFailsWhenIntakeCannotOpen(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	zctx, _ := zmq.NewContext()
	defer zctx.Term()
	holder, _ := zctx.NewSocket(zmq.PUB)
	defer holder.Close()
	_ = holder.SetLinger(0)
	if err := holder.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	taken, _ := holder.GetLastEndpoint()
	cfg := sidecarConfig(e)
	cfg.Bind, cfg.KVEvents = true, taken
	if s, err := sidecar.Start(context.Background(), cfg, nil, nil); err == nil {
		s.Close()
		t.Fatal("Start succeeded with an intake that could not bind")
	}
}
