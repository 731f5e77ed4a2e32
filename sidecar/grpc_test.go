package sidecar_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/testnet"
)

// replica follows a watch stream the way a picker does.
type replica struct {
	t      *testing.T
	params summary.Params
	snaps  map[string]*summary.Snapshot // "<endpoint>|<tier>"
	epochs map[string]uint64
	kinds  []string
	loads  int
	load   *pb.LoadReport // the last load report
	feeds  pb.Feeds
	// compact counts deltas that came as a feed number alone.
	compact int
}

func (r *replica) apply(u *pb.SummaryUpdate) {
	if u.Endpoint == "" && u.Feed != 0 {
		r.compact++
	}
	if err := r.feeds.Resolve(u); err != nil {
		r.t.Fatal(err)
	}
	key := u.Endpoint + "|" + u.Tier
	switch b := u.Body.(type) {
	case *pb.SummaryUpdate_Snapshot:
		s, err := summary.DecodeSnapshot(b.Snapshot.Data, r.params)
		if err != nil {
			r.t.Fatal(err)
		}
		r.snaps[key], r.epochs[key] = &s, u.Epoch
		r.kinds = append(r.kinds, "snapshot")
	case *pb.SummaryUpdate_Delta:
		d, err := summary.DecodeDelta(b.Delta.Data, b.Delta.Seq, r.params)
		if err != nil {
			r.t.Fatal(err)
		}
		s := r.snaps[key]
		if s == nil || r.epochs[key] != u.Epoch {
			r.t.Fatalf("delta %d for %s without a snapshot of epoch %d", d.Seq, key, u.Epoch)
		}
		if err := s.Apply(d); err != nil {
			r.t.Fatal(err)
		}
		r.kinds = append(r.kinds, "delta")
	case *pb.SummaryUpdate_Load:
		r.loads++
		r.load = b.Load
	}
}

func (r *replica) known() map[string]*pb.Position {
	out := map[string]*pb.Position{}
	for k, s := range r.snaps {
		out[k] = &pb.Position{Epoch: r.epochs[k], Seq: s.Seq}
	}
	return out
}

// follow reads the stream until cond holds (bounded).
func (r *replica) follow(stream grpc.ServerStreamingClient[pb.SummaryUpdate], cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("stream never reached the expected state; got %v", r.kinds)
		}
		u, err := stream.Recv()
		if err != nil {
			r.t.Fatal(err)
		}
		r.apply(u)
	}
}

func keysOf(p []int, salt string) []blockkey.Key {
	toks := make([]uint32, len(p))
	for i, v := range p {
		toks[i] = uint32(v)
	}
	return (&blockkey.Request{Tokens: toks, CacheSalt: salt}).AppendKeys(nil, "Qwen/Qwen3-0.6B", 16)
}

// TestWatchSummaries: a watcher rebuilds every endpoint's summary from a
// snapshot and deltas, resumes from its position with deltas only, and
// moves to a new epoch on reset.
func TestWatchSummaries(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	cfg := sidecarConfig(e)
	s := startSidecar(t, cfg)
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewSidecarClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	info, err := client.Info(ctx, &pb.InfoRequest{})
	if err != nil || len(info.Endpoints) != 1 || info.Endpoints[0].KeyFormat != blockkey.FormatV1 || info.Endpoints[0].SummaryParams != cfg.Params().String() ||
		info.Endpoints[0].DebugUrl != "http://"+s.DebugAddr() {
		t.Fatalf("info %+v %v", info, err)
	}
	key := e.URL() + "|GPU"
	r := &replica{t: t, params: cfg.Params(), snaps: map[string]*summary.Snapshot{}, epochs: map[string]uint64{}}
	stream, err := client.WatchSummaries(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	prompts := [][]int{prompt(80, 1000), prompt(64, 3000), prompt(96, 5000)}
	for _, p := range prompts {
		complete(t, e, p, "tenant")
	}
	converged(t, s, e, 0)
	mayContainAll := func() bool {
		snap := r.snaps[key]
		if snap == nil {
			return false
		}
		for _, p := range prompts {
			for _, k := range keysOf(p, "tenant") {
				if !snap.MayContain(k) {
					return false
				}
			}
		}
		return true
	}
	r.follow(stream, mayContainAll)
	if r.loads == 0 {
		r.follow(stream, func() bool { return r.loads > 0 })
	}
	// The same tokens unsalted were never stored: a salted chain shares no
	// key with the unsalted one, so the summary holds none of them (the
	// keys and parameters are fixed: a false positive would show every run).
	for _, k := range keysOf(prompt(80, 1000), "") {
		if r.snaps[key].MayContain(k) {
			t.Fatalf("unsalted key %s in a summary of salted blocks", k)
		}
	}
	// Every delta after the snapshot came as a feed number alone.
	deltas := 0
	for _, k := range r.kinds {
		if k == "delta" {
			deltas++
		}
	}
	if deltas == 0 || r.compact != deltas {
		t.Fatalf("%d of %d deltas compact", r.compact, deltas)
	}
	// A second watcher that knows this position gets no snapshot (and its
	// stream names each feed in full before numbering it: Resolve checks).
	pos := r.known()
	stream.CloseSend()
	r2 := &replica{t: t, params: cfg.Params(), snaps: map[string]*summary.Snapshot{}, epochs: map[string]uint64{}}
	for k, p := range pos {
		snap := *r.snaps[k]
		snap.Words = append([]uint64(nil), snap.Words...)
		r2.snaps[k], r2.epochs[k] = &snap, p.Epoch
	}
	stream2, err := client.WatchSummaries(ctx, &pb.WatchRequest{Known: pos})
	if err != nil {
		t.Fatal(err)
	}
	more := prompt(48, 9000)
	complete(t, e, more, "")
	r2.follow(stream2, func() bool {
		for _, k := range keysOf(more, "") {
			if !r2.snaps[key].MayContain(k) {
				return false
			}
		}
		return true
	})
	for _, k := range r2.kinds {
		if k == "snapshot" {
			t.Fatalf("resumed watcher got a snapshot: %v", r2.kinds)
		}
	}
	// Reset: a snapshot of the next epoch, empty.
	epoch := r2.epochs[key]
	post(t, e.URL()+"/reset_prefix_cache", nil)
	r2.follow(stream2, func() bool { return r2.epochs[key] == epoch+1 })
	for _, k := range keysOf(more, "") {
		if r2.snaps[key].MayContain(k) {
			t.Fatal("the new epoch's summary still holds old keys")
		}
	}
}

// TestLoadReportCarriesEngineStats: every load report forwards the
// engine's own request figures, cumulative, as its /metrics has them: the
// queue, prefill and TTFT histograms' sums and counts, the prompt tokens
// and the prefix-cache hits.
func TestLoadReportCarriesEngineStats(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	cfg := sidecarConfig(e)
	cfg.ScrapeInterval = 20 * time.Millisecond
	s := startSidecar(t, cfg)
	stream, _ := watchPlain(t, s.GRPCAddr())
	r := &replica{t: t, params: cfg.Params(), snaps: map[string]*summary.Snapshot{}, epochs: map[string]uint64{}}
	r.follow(stream, func() bool { return r.load.GetEngine().GetHave() }) // once scraped
	if g := r.load.GetEngine(); g.GetTtftCount() != 0 || g.GetPromptTokens() != 0 {
		t.Fatalf("before any request: %+v, want zeros", g)
	}
	// The second prompt is the first again: 4 full blocks of 16 cached.
	for _, p := range [][]int{prompt(80, 1000), prompt(80, 1000), prompt(64, 3000)} {
		complete(t, e, p, "")
	}
	r.follow(stream, func() bool { return r.load.GetEngine().GetQueueCount() == 3 })
	g := r.load.GetEngine()
	if g.GetTtftCount() != 3 || g.GetPrefillCount() != 3 || g.GetPromptTokens() != 80+80+64 || g.GetCachedTokens() != 64 {
		t.Fatalf("after three requests: %+v", g)
	}
	if g.GetTtftSeconds() <= 0 || g.GetPrefillSeconds() <= 0 || math.Abs(g.GetQueueSeconds()+g.GetPrefillSeconds()-g.GetTtftSeconds()) > 1e-9 {
		t.Fatalf("sums: %+v; want queue + prefill = TTFT > 0", g)
	}
}

// TestWatchOverTLS: with a certificate the stream runs over TLS, and a
// plaintext client is refused.
func TestWatchOverTLS(t *testing.T) {
	certFile, keyFile, pool := testnet.SelfSigned(t)
	e := startEngine(t, engineConfig()).Engines()[0]
	cfg := sidecarConfig(e)
	cfg.GRPCTLSCert, cfg.GRPCTLSKey = certFile, keyFile
	s := startSidecar(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewClientTLSFromCert(pool, "localhost")))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if info, err := pb.NewSidecarClient(conn).Info(ctx, &pb.InfoRequest{}); err != nil || len(info.Endpoints) != 1 {
		t.Fatalf("TLS info: %v", err)
	}
	plain, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	short, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel2()
	if _, err := pb.NewSidecarClient(plain).Info(short, &pb.InfoRequest{}); err == nil {
		t.Fatal("plaintext client served by a TLS server")
	}
}

// TestCloseEndsSummaryStreams: closing the sidecar ends its summary
// streams at once, saying why, instead of holding the graceful stop
// until its deadline and cutting them.
func TestCloseEndsSummaryStreams(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	s := startSidecar(t, sidecarConfig(e))
	stream, _ := watchPlain(t, s.GRPCAddr())
	if _, err := stream.Recv(); err != nil { // the initial state: the stream is open
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	for {
		_, err := stream.Recv()
		if err == nil {
			continue // the rest of the initial state
		}
		if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "shutting down") {
			t.Fatalf("the stream ended with %v, want Unavailable: the sidecar is shutting down", err)
		}
		break
	}
	<-closed
}

// watchPlain opens a summary stream to the sidecar at addr without TLS,
// for at most 30 s; cancel ends it early (the test's end does too).
func watchPlain(t *testing.T, addr string) (stream pb.Sidecar_WatchSummariesClient, cancel context.CancelFunc) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if stream, err = pb.NewSidecarClient(conn).WatchSummaries(ctx, &pb.WatchRequest{}); err != nil {
		t.Fatal(err)
	}
	return stream, cancel
}
