package fleetview_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// simSidecar is a simulated sidecar for the picker-side benchmarks: a real
// gRPC server speaking kvroute.v1.Sidecar for one endpoint whose summary
// (a real summary.Counting) is full and turns over rate blocks a second —
// each stored block evicts one — taking a delta every interval, as a
// sidecar does. Each delta is stamped with the time of the oldest block it
// carries, so the picker's lag histogram measures batching, transport and
// apply, without an engine's or a sidecar's CPU in this process.
type simSidecar struct {
	pb.UnimplementedSidecarServer
	endpoint string
	params   summary.Params
	addr     string

	mu   sync.Mutex
	c    *summary.Counting
	subs map[chan *pb.SummaryUpdate]struct{}
}

func startSimSidecar(b *testing.B, i int, params summary.Params, rate int, interval time.Duration) *simSidecar {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := &simSidecar{endpoint: fmt.Sprintf("http://sim-%d:8000", i), params: params, addr: ln.Addr().String(),
		c: summary.NewCounting(params), subs: map[chan *pb.SummaryUpdate]struct{}{}}
	rng := rand.New(rand.NewPCG(uint64(i), 99))
	held := make([]blockkey.Key, params.M/summary.BitsPerBlock)
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
		perTick := rate * int(interval) / int(time.Second)
		tick := time.NewTicker(interval)
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
				if d, ok := s.c.TakeDelta(); ok {
					// The interval's first block came just after the last delta.
					u := &pb.SummaryUpdate{Feed: 1, Body: &pb.SummaryUpdate_Delta{Delta: &pb.Delta{
						Seq: d.Seq, Data: summary.AppendDelta(nil, d), OldestEventUnixNanos: last.UnixNano()}}}
					for ch := range s.subs {
						select {
						case ch <- u:
						default: // too far behind: cut, as a sidecar does
							delete(s.subs, ch)
							close(ch)
						}
					}
				}
				s.mu.Unlock()
				last = now
			}
		}
	}()
	b.Cleanup(func() { cancel(); <-done; srv.Stop() })
	return s
}

func (s *simSidecar) Info(context.Context, *pb.InfoRequest) (*pb.InfoResponse, error) {
	return &pb.InfoResponse{Endpoints: []*pb.EndpointInfo{{Endpoint: s.endpoint, Model: "sim", BlockSize: 16,
		KeyFormat: blockkey.FormatV1, SummaryParams: s.params.String(), Epoch: 1}}}, nil
}

func (s *simSidecar) WatchSummaries(_ *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.SummaryUpdate]) error {
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
	if err := stream.Send(&pb.SummaryUpdate{Endpoint: s.endpoint, Tier: "GPU", Epoch: 1, Feed: 1,
		Body: &pb.SummaryUpdate_Snapshot{Snapshot: &pb.Snapshot{Seq: snap.Seq, Data: summary.AppendSnapshot(nil, snap)}}}); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case u, ok := <-ch:
			if !ok {
				return errors.New("cut")
			}
			if err := stream.Send(u); err != nil {
				return err
			}
		}
	}
}

// BenchmarkFleetSyncSimulated: a picker started against 64 simulated
// sidecars, each with a full 65,536-block summary and 1,000 blocks/s of
// churn, until every endpoint's snapshot is applied — the restarted-picker
// sync, over gRPC on loopback. One op is one picker's full sync.
func BenchmarkFleetSyncSimulated(b *testing.B) {
	const endpoints, capacity, rate = 64, 65536, 1000
	params := summary.ForCapacity(capacity)
	var sims []*simSidecar
	for i := range endpoints {
		sims = append(sims, startSimSidecar(b, i, params, rate, 10*time.Millisecond))
	}
	b.ResetTimer()
	for range b.N {
		reg := prometheus.NewRegistry()
		v, err := fleetview.New(fleetview.Config{Params: params, Retry: 100 * time.Millisecond}, zap.NewNop(), reg)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range sims {
			v.Watch(s.addr)
		}
		deadline := time.Now().Add(30 * time.Second)
		for appliedSnapshots(b, reg) < endpoints {
			if time.Now().After(deadline) {
				b.Fatal("not synced after 30 s")
			}
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		v.Close()
		b.StartTimer()
	}
}

func appliedSnapshots(b *testing.B, reg *prometheus.Registry) float64 {
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "kvroute_picker_summary_updates_total" {
			for _, m := range f.Metric {
				if label(m, "kind") == "snapshot" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// BenchmarkFleetLagSimulated: one picker following 64 simulated sidecars,
// each endpoint storing (and evicting) 1,000 blocks a second into a full
// 65,536-block summary with deltas every 10 ms — the scale for the
// event-to-routable lag, picker side. The run lasts b.N deltas per sidecar
// (-benchtime 500x = 5 s).
func BenchmarkFleetLagSimulated(b *testing.B) {
	const endpoints, capacity, rate = 64, 65536, 1000
	params := summary.ForCapacity(capacity)
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(fleetview.Config{Params: params, Retry: 100 * time.Millisecond}, zap.NewNop(), reg)
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	for i := range endpoints {
		v.Watch(startSimSidecar(b, i, params, rate, 10*time.Millisecond).addr)
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(v.Endpoints()) < endpoints || pickerLag(b, reg).GetSampleCount() < endpoints {
		if time.Now().After(deadline) {
			b.Fatalf("%d endpoints after a minute", len(v.Endpoints()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // past the snapshots' load
	before := pickerLag(b, reg)
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * 10 * time.Millisecond)
	b.StopTimer()
	after := pickerLag(b, reg)
	b.ReportMetric(float64(after.GetSampleCount()-before.GetSampleCount())/float64(b.N)/endpoints, "deltas/tick/endpoint")
	b.ReportMetric(quantile(before, after, 0.5)*1000, "lag-p50-ms≤")
	b.ReportMetric(quantile(before, after, 0.99)*1000, "lag-p99-ms≤")
}
