package simsidecar

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// Config describes one simulated endpoint.
type Config struct {
	Index    int            // names the endpoint http://127.0.0.1:<10000+Index> (0..55535) and seeds its keys
	Params   summary.Params // the fleet's summary parameters
	Rate     int            // blocks stored (and evicted) per second; 0: none
	Interval time.Duration  // between deltas; default 10 ms
	Model    string         // default "sim"
	// NoBlockSize reports block size 0, as a sidecar does before it has
	// learnt the engine's.
	NoBlockSize bool
	// Endpoint is the engine URL announced; default
	// http://127.0.0.1:<10000+Index>: an engine on the sidecar's host, as
	// the picker's trust check wants (the sidecar serves on 127.0.0.1).
	// Nothing listens there: the engine is simulated.
	Endpoint string
	// Still runs no delta timer and no churn (Rate and Interval are
	// ignored): the summary stays as filled, and Hold sends its delta at
	// once. A thousand still sidecars cost a process no wakeups but their
	// streams' load reports.
	Still bool
}

// Sidecar is a running simulated sidecar.
type Sidecar struct {
	pb.UnimplementedSidecarServer
	cfg      Config
	endpoint string
	addr     string

	infos, watches atomic.Int64 // calls of Info and WatchSummaries
	sent, sentMsgs atomic.Int64 // bytes (protobuf encoding) and messages sent on summary streams
	deltas         atomic.Int64 // deltas published

	mu   sync.Mutex
	c    *summary.Counting
	subs map[chan *pb.SummaryUpdate]struct{}
}

// Start serves a simulated sidecar on 127.0.0.1 until the test ends.
func Start(t testing.TB, cfg Config) *Sidecar {
	t.Helper()
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Millisecond
	}
	if cfg.Model == "" {
		cfg.Model = "sim"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Endpoint == "" {
		if cfg.Index < 0 || cfg.Index > 65535-10000 {
			t.Fatalf("simsidecar: index %d: want 0..%d, or give the Endpoint", cfg.Index, 65535-10000)
		}
		cfg.Endpoint = fmt.Sprintf("http://127.0.0.1:%d", 10000+cfg.Index)
	}
	s := &Sidecar{cfg: cfg, endpoint: cfg.Endpoint, addr: ln.Addr().String(),
		c: summary.NewCounting(cfg.Params), subs: map[chan *pb.SummaryUpdate]struct{}{}}
	rng := rand.New(rand.NewPCG(uint64(cfg.Index), 99))
	held := make([]blockkey.Key, cfg.Params.M/summary.BitsPerBlock)
	for j := range held {
		held[j] = blockkey.Key(rng.Uint64())
		s.c.Add(held[j])
	}
	s.c.TakeDelta()
	srv := grpc.NewServer()
	pb.RegisterSidecarServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if cfg.Still {
			return
		}
		perTick := cfg.Rate * int(cfg.Interval) / int(time.Second)
		tick := time.NewTicker(cfg.Interval)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				s.mu.Lock()
				for range perTick {
					j := rng.IntN(len(held))
					s.c.Remove(held[j])
					held[j] = blockkey.Key(rng.Uint64())
					s.c.Add(held[j])
				}
				s.publishLocked(last)
				s.mu.Unlock()
				last = now
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; srv.Stop() })
	return s
}

// publishLocked sends the pending flips as a delta. Callers hold s.mu.
func (s *Sidecar) publishLocked(oldest time.Time) {
	d, ok := s.c.TakeDelta()
	if !ok {
		return
	}
	s.deltas.Add(1)
	u := &pb.SummaryUpdate{Feed: 1, Body: &pb.SummaryUpdate_Delta{Delta: &pb.Delta{
		Seq: d.Seq, Data: summary.AppendDelta(nil, d), OldestEventUnixNanos: oldest.UnixNano()}}}
	for ch := range s.subs {
		select {
		case ch <- u:
		default: // too far behind: cut, as a sidecar does
			delete(s.subs, ch)
			close(ch)
		}
	}
}

// Hold adds keys the endpoint keeps (never turned over); they reach
// watchers with the next delta.
func (s *Sidecar) Hold(keys ...blockkey.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		s.c.Add(k)
	}
	if s.cfg.Still {
		s.publishLocked(time.Now())
	}
}

// Infos is how many times a picker asked the sidecar what it serves.
func (s *Sidecar) Infos() int64 { return s.infos.Load() }

// Watches is how many summary streams a picker opened to the sidecar.
func (s *Sidecar) Watches() int64 { return s.watches.Load() }

// Sent is how many bytes of summary updates (their protobuf encoding,
// without gRPC framing) the sidecar has sent, on all its streams.
func (s *Sidecar) Sent() int64 { return s.sent.Load() }

// Deltas is how many deltas the sidecar has published (each sent to
// every watcher then).
func (s *Sidecar) Deltas() int64 { return s.deltas.Load() }

// SentMessages is how many summary updates the sidecar has sent.
func (s *Sidecar) SentMessages() int64 { return s.sentMsgs.Load() }

// send sends u on stream, counted.
func (s *Sidecar) send(stream grpc.ServerStreamingServer[pb.SummaryUpdate], u *pb.SummaryUpdate) error {
	if err := stream.Send(u); err != nil {
		return err
	}
	s.sent.Add(int64(proto.Size(u)))
	s.sentMsgs.Add(1)
	return nil
}

// Addr is the gRPC address.
func (s *Sidecar) Addr() string { return s.addr }

// Endpoint is the simulated engine URL.
func (s *Sidecar) Endpoint() string { return s.endpoint }

// Info describes the endpoint.
func (s *Sidecar) Info(context.Context, *pb.InfoRequest) (*pb.InfoResponse, error) {
	s.infos.Add(1)
	bs := int32(16)
	if s.cfg.NoBlockSize {
		bs = 0
	}
	return &pb.InfoResponse{Endpoints: []*pb.EndpointInfo{{Endpoint: s.endpoint, Model: s.cfg.Model, BlockSize: bs,
		KeyFormat: blockkey.FormatV1, SummaryParams: s.cfg.Params.String(), Epoch: 1}}}, nil
}

// WatchSummaries sends a snapshot and an idle load report (a sidecar's
// first state), then every delta, and an idle load report every 200 ms.
func (s *Sidecar) WatchSummaries(_ *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.SummaryUpdate]) error {
	s.watches.Add(1)
	ch := make(chan *pb.SummaryUpdate, 1024)
	s.mu.Lock()
	snap := s.c.Snapshot()
	s.subs[ch] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, ch)
		s.mu.Unlock()
	}()
	if err := s.send(stream, &pb.SummaryUpdate{Endpoint: s.endpoint, Tier: "GPU", Epoch: 1, Feed: 1,
		Body: &pb.SummaryUpdate_Snapshot{Snapshot: &pb.Snapshot{Seq: snap.Seq, Data: summary.AppendSnapshot(nil, snap)}}}); err != nil {
		return err
	}
	// An idle engine's load report, as a sidecar scrapes it from a vLLM
	// that exports its request histograms but has served nothing: one
	// at once after the snapshot, as a sidecar's first state ends, then
	// every 200 ms.
	report := func(now time.Time) error {
		return s.send(stream, &pb.SummaryUpdate{Endpoint: s.endpoint, Epoch: 1,
			Body: &pb.SummaryUpdate_Load{Load: &pb.LoadReport{ScrapedUnixNanos: now.UnixNano(), Engine: &pb.EngineStats{Have: true}}}})
	}
	if err := report(time.Now()); err != nil {
		return err
	}
	load := time.NewTicker(200 * time.Millisecond)
	defer load.Stop()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case now := <-load.C:
			if err := report(now); err != nil {
				return err
			}
		case u, ok := <-ch:
			if !ok {
				return errors.New("watcher cut: too far behind")
			}
			if err := s.send(stream, u); err != nil {
				return err
			}
		}
	}
}
