package sidecar

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/sidecar/streamhealth"
)

// grpcServer implements the Sidecar service.
type grpcServer struct {
	pb.UnimplementedSidecarServer
	s *Sidecar
}

func (s *Sidecar) newGRPCServer() (*grpc.Server, error) {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(1 << 20), // requests are tiny
		grpc.MaxConcurrentStreams(256),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if s.tls != nil {
		opts = append(opts, grpc.Creds(s.tls.creds))
	}
	g := grpc.NewServer(opts...)
	pb.RegisterSidecarServer(g, &grpcServer{s: s})
	return g, nil
}

// maxKnown bounds the positions a watcher may send.
const maxKnown = 4096

func snapshotUpdate(endpoint string, t tier.Tier, epoch uint64, snap summary.Snapshot) *pb.SummaryUpdate {
	return &pb.SummaryUpdate{Endpoint: endpoint, Tier: t.String(), Epoch: epoch,
		Body: &pb.SummaryUpdate_Snapshot{Snapshot: &pb.Snapshot{Seq: snap.Seq, Data: summary.AppendSnapshot(nil, snap)}}}
}

func (g *grpcServer) WatchSummaries(req *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.SummaryUpdate]) error {
	s := g.s
	if len(req.GetKnown()) > maxKnown {
		return status.Errorf(codes.InvalidArgument, "%d known positions; at most %d", len(req.GetKnown()), maxKnown)
	}
	sub := &subscriber{ch: make(chan *pb.SummaryUpdate, subBuffer), cut: make(chan struct{})}
	var initial []*pb.SummaryUpdate
	// Every endpoint's state and the subscription are taken under the
	// endpoints' locks, so no delta falls between the two.
	for _, ep := range s.endpoints {
		ep.mu.Lock()
	}
	s.hub.mu.Lock()
	for _, ep := range s.endpoints {
		id := ep.identity.Endpoint
		for _, t := range ep.idx.Tiers() {
			sum := ep.idx.Summary(t)
			if k, ok := req.GetKnown()[feedKey(id, t.String())]; ok && k.GetEpoch() == ep.epoch {
				if ds, ok := s.hub.sinceLocked(id, t.String(), ep.epoch, k.GetSeq(), sum.Seq()); ok {
					initial = append(initial, ds...)
					continue
				}
			}
			initial = append(initial, snapshotUpdate(id, t, ep.epoch, sum.Snapshot()))
		}
		initial = append(initial, loadUpdate(id, ep.epoch, ep.load, ep.stream, s.drainReason()))
	}
	s.hub.subs[sub] = struct{}{}
	s.hub.mu.Unlock()
	for i := len(s.endpoints) - 1; i >= 0; i-- {
		s.endpoints[i].mu.Unlock()
	}
	s.metrics.watchers.Inc()
	defer s.metrics.watchers.Dec()
	defer s.hub.remove(sub)
	feeds := feedNumbers{}
	for _, u := range initial {
		if err := g.send(stream, feeds.compact(u)); err != nil {
			return err
		}
	}
	for {
		select {
		case u := <-sub.ch:
			if err := g.send(stream, feeds.compact(u)); err != nil {
				return err
			}
		case <-sub.cut:
			return status.Error(codes.ResourceExhausted, "watcher fell too far behind; watch again to resume from a snapshot")
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-s.stopping:
			// The sidecar is closing: end the stream now rather than hold
			// the graceful stop until its deadline (the picker's view
			// retries, and finds the sidecar gone or back).
			return status.Error(codes.Unavailable, "the sidecar is shutting down")
		}
	}
}

// feedNumbers is one stream's numbering of its (endpoint, tier) pairs and
// the epoch last sent in full for each (SummaryUpdate.feed).
type feedNumbers map[string]*feedNumber

type feedNumber struct {
	id    uint32
	epoch uint64
}

// compact returns u numbered for this stream: a delta of a pair already
// sent in full in the same epoch goes as its number alone. u is shared by
// every watcher and is never modified.
func (f feedNumbers) compact(u *pb.SummaryUpdate) *pb.SummaryUpdate {
	if u.Tier == "" {
		return u // a load report: no feed
	}
	key := feedKey(u.Endpoint, u.Tier)
	n := f[key]
	if n != nil && n.epoch == u.Epoch && u.GetDelta() != nil {
		return &pb.SummaryUpdate{Feed: n.id, Body: u.Body}
	}
	if n == nil {
		n = &feedNumber{id: uint32(len(f) + 1)}
		f[key] = n
	}
	n.epoch = u.Epoch
	return &pb.SummaryUpdate{Endpoint: u.Endpoint, Tier: u.Tier, Epoch: u.Epoch, Feed: n.id, Body: u.Body}
}

func (g *grpcServer) send(stream grpc.ServerStreamingServer[pb.SummaryUpdate], u *pb.SummaryUpdate) error {
	kind := "load"
	switch u.Body.(type) {
	case *pb.SummaryUpdate_Snapshot:
		kind = "snapshot"
	case *pb.SummaryUpdate_Delta:
		kind = "delta"
	}
	g.s.metrics.updates.WithLabelValues(kind).Inc()
	// The bytes on the wire for this watcher: the message and gRPC's
	// 5-byte length prefix (HTTP/2 framing not included).
	g.s.metrics.streamBytes.WithLabelValues(kind).Add(float64(proto.Size(u) + 5))
	if err := stream.Send(u); err != nil {
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	return nil
}

// loadUpdate is a load report: the load and the engine's request figures
// as last scraped (the last good values when the engine is down, with the
// time of that scrape), the engine's health, the event stream's, and the
// drain announced ("" none).
func loadUpdate(endpoint string, epoch uint64, l Load, stream streamhealth.Status, drain string) *pb.SummaryUpdate {
	return &pb.SummaryUpdate{Endpoint: endpoint, Epoch: epoch, Body: &pb.SummaryUpdate_Load{Load: &pb.LoadReport{
		Waiting: l.Waiting, Running: l.Running, KvCacheUsage: l.KVUsage, ScrapedUnixNanos: l.At.UnixNano(),
		EngineDown: l.Error != "", EngineError: l.Error,
		StreamState: stream.State.String(), StreamReason: stream.Reason,
		Draining: drain != "", DrainReason: drain, Engine: engineStatsProto(l.Engine)}}}
}

// engineStatsProto is the engine's request figures on the wire.
func engineStatsProto(s EngineStats) *pb.EngineStats {
	return &pb.EngineStats{Have: s.Have, QueueSeconds: s.QueueSeconds, QueueCount: s.QueueCount,
		PrefillSeconds: s.PrefillSeconds, PrefillCount: s.PrefillCount, TtftSeconds: s.TTFTSeconds, TtftCount: s.TTFTCount,
		PromptTokens: s.PromptTokens, CachedTokens: s.CachedTokens}
}

func (g *grpcServer) Info(ctx context.Context, _ *pb.InfoRequest) (*pb.InfoResponse, error) {
	out := &pb.InfoResponse{}
	for _, ep := range g.s.endpoints {
		ep.mu.Lock()
		id := ep.identity
		out.Endpoints = append(out.Endpoints, &pb.EndpointInfo{
			Endpoint: id.Endpoint, Rank: int32(id.Rank), Model: id.Model, BlockSize: int32(id.BlockSize),
			NumGpuBlocks: int32(id.NumGPUBlocks), HashAlgo: id.HashAlgo, KeyFormat: id.KeyFormat,
			SummaryParams: id.SummaryParams, TokenizerFingerprint: id.TokenizerFingerprint,
			Epoch: ep.epoch, Partial: ep.partial, DebugUrl: g.s.debugURL,
			StreamState: ep.stream.State.String(), StreamReason: ep.stream.Reason, KvSource: ep.kvSource,
		})
		ep.mu.Unlock()
	}
	return out, nil
}
