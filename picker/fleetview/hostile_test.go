package fleetview_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleetview"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// scriptedSidecar answers each WatchSummaries call with the next script in
// its list (the last one repeats), then holds the stream open.
type scriptedSidecar struct {
	pb.UnimplementedSidecarServer
	info *pb.InfoResponse

	mu      sync.Mutex
	scripts [][]*pb.SummaryUpdate
	calls   int
}

func (s *scriptedSidecar) Info(context.Context, *pb.InfoRequest) (*pb.InfoResponse, error) {
	return s.info, nil
}

func (s *scriptedSidecar) WatchSummaries(_ *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.SummaryUpdate]) error {
	s.mu.Lock()
	script := s.scripts[min(s.calls, len(s.scripts)-1)]
	s.calls++
	s.mu.Unlock()
	for _, u := range script {
		if err := stream.Send(u); err != nil {
			return err
		}
	}
	<-stream.Context().Done()
	return nil
}

func (s *scriptedSidecar) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func serveScripted(t *testing.T, s *scriptedSidecar) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterSidecarServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// TestBadUpdatesRecoverFromSnapshots: a sidecar whose stream skips a
// delta, sends an undecodable one, or numbers a feed it never named, gets
// its stream restarted (a new call, which the scripted sidecar answers
// with a snapshot); each is counted, and the snapshot restores the exact
// state.
func TestBadUpdatesRecoverFromSnapshots(t *testing.T) {
	p := summary.ForCapacity(capacity)
	const url = "http://127.0.0.1:8000" // an engine beside the sidecar, on 127.0.0.1
	info := &pb.InfoResponse{Endpoints: []*pb.EndpointInfo{{Endpoint: url, Model: "m", BlockSize: 16,
		KeyFormat: blockkey.FormatV1, SummaryParams: p.String(), Epoch: 1}}}
	chain := (&blockkey.Request{Tokens: tokens(160, 7000)}).AppendKeys(nil, "m", 16)
	c := summary.NewCounting(p)
	empty := c.Snapshot()
	for _, k := range chain[:4] {
		c.Add(k)
	}
	d1, _ := c.TakeDelta()
	for _, k := range chain[4:8] {
		c.Add(k)
	}
	d2, _ := c.TakeDelta()
	full := c.Snapshot() // chain[:8], seq 2
	snapshot := func(s summary.Snapshot) *pb.SummaryUpdate {
		return &pb.SummaryUpdate{Endpoint: url, Tier: "GPU", Epoch: 1, Feed: 1,
			Body: &pb.SummaryUpdate_Snapshot{Snapshot: &pb.Snapshot{Seq: s.Seq, Data: summary.AppendSnapshot(nil, s)}}}
	}
	delta := func(d summary.Delta, data []byte) *pb.SummaryUpdate {
		if data == nil {
			data = summary.AppendDelta(nil, d)
		}
		return &pb.SummaryUpdate{Feed: 1, Body: &pb.SummaryUpdate_Delta{Delta: &pb.Delta{Seq: d.Seq, Data: data}}}
	}
	for _, tc := range []struct {
		name, counter string
		bad           []*pb.SummaryUpdate
	}{
		{"skipped delta", "kvroute_picker_summary_resyncs_total", []*pb.SummaryUpdate{snapshot(empty), delta(d2, nil)}},
		{"undecodable delta", "kvroute_picker_summary_malformed_total", []*pb.SummaryUpdate{snapshot(empty), delta(d1, []byte{2, 1, 0xff})}},
		{"unnamed feed", "kvroute_picker_summary_malformed_total", []*pb.SummaryUpdate{{Feed: 7, Body: &pb.SummaryUpdate_Delta{Delta: &pb.Delta{Seq: 1}}}}},
		{"snapshot of other parameters", "kvroute_picker_summary_malformed_total", []*pb.SummaryUpdate{snapshot(summary.NewCounting(summary.ForCapacity(10)).Snapshot())}},
		{"unknown tier", "kvroute_picker_summary_malformed_total", []*pb.SummaryUpdate{{Endpoint: url, Tier: "NVME", Epoch: 1, Feed: 2,
			Body: &pb.SummaryUpdate_Delta{Delta: &pb.Delta{Seq: 2, Data: summary.AppendDelta(nil, d2)}}}}},
		{"no tier", "kvroute_picker_summary_malformed_total", []*pb.SummaryUpdate{{Endpoint: url, Epoch: 1,
			Body: &pb.SummaryUpdate_Snapshot{Snapshot: &pb.Snapshot{Seq: full.Seq, Data: summary.AppendSnapshot(nil, full)}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// First call: good state (chain[:4]) then the bad update;
			// second call: a snapshot of chain[:8].
			script := append([]*pb.SummaryUpdate{snapshot(empty), delta(d1, nil)}, tc.bad...)
			s := &scriptedSidecar{info: info, scripts: [][]*pb.SummaryUpdate{script, {snapshot(full)}}}
			addr := serveScripted(t, s)
			reg := prometheus.NewRegistry()
			v, err := fleetview.New(viewConfig(p, 20*time.Millisecond), zap.NewNop(), reg)
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			v.Watch(addr)
			group := fleetview.GroupID(info.Endpoints[0])
			testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
				if n := v.Match(group, tier.GPU, chain)[url]; n != 8 {
					return fmt.Errorf("never recovered: matched %d after %d calls", n, s.Calls())
				}
				return nil
			})
			if n := metrictest.Gathered(t, reg, tc.counter, nil); n < 1 {
				t.Fatalf("%s = %v", tc.counter, n)
			}
			if s.Calls() < 2 {
				t.Fatal("recovered without a new stream")
			}
		})
	}
}

// TestEngineFaultsReachTheView: events the engine drops are recovered (by
// the sidecar's replay) before the view agrees with the engines' caches,
// and an engine restart (a new epoch) drops the endpoint's old blocks from
// the view.
func TestEngineFaultsReachTheView(t *testing.T) {
	var pods []*pod
	for i := 0; i < 2; i++ {
		join := ""
		if i > 0 {
			join = pods[0].members.LocalAddr()
		}
		pods = append(pods, startPod(t, i, join))
	}
	pk := startPicker(t, "picker", pods[0].members.LocalAddr())
	// Every event of request 0 is lost on the wire (not in the engine's
	// replay ring): the sidecar notices the silence and replays.
	replays := metrictest.Gathered(t, pods[0].sidecar.Registry(), "kvroute_sidecar_replays_total", nil)
	if err := pods[0].engine.SetEventFaults(100, 0); err != nil {
		t.Fatal(err)
	}
	reqs := map[int][]uint32{0: tokens(320, 11000), 1: tokens(96, 13000)}
	complete(t, pods[0].engine, reqs[0])
	if err := pods[0].engine.SetEventFaults(0, 0); err != nil {
		t.Fatal(err)
	}
	complete(t, pods[1].engine, reqs[1])
	agree(t, pk.view, pods, reqs, 15*time.Second)
	if n := metrictest.Gathered(t, pods[0].sidecar.Registry(), "kvroute_sidecar_replays_total", nil); n <= replays {
		t.Fatalf("the lost events came back without a replay (%v replays before, %v after)", replays, n)
	}
	// Restart engine 0: its cache is empty, and so must its view be.
	if err := pods[0].engine.Restart(); err != nil {
		t.Fatal(err)
	}
	group := pk.view.Endpoints()[0].Group
	chain := (&blockkey.Request{Tokens: reqs[0]}).AppendKeys(nil, "Qwen/Qwen3-0.6B", 16)
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		if n := pk.view.Match(group, tier.GPU, chain)[pods[0].engine.URL()]; n != 0 {
			return fmt.Errorf("the restarted engine's old blocks are still in the view: %d matched", n)
		}
		return nil
	})
	reqs[0] = tokens(48, 17000)
	complete(t, pods[0].engine, reqs[0])
	agree(t, pk.view, pods, reqs, 15*time.Second)
}
