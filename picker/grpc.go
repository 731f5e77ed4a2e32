package picker

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/render"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// grpcPicker serves kvroute.v1.Picker.
type grpcPicker struct {
	pb.UnimplementedPickerServer
	r     *Router
	token func() string // the bearer token calls must carry now ("" none)
}

// RegisterGRPC adds the Picker service to s; token, when set, is the
// bearer token calls must carry.
func (r *Router) RegisterGRPC(s *grpc.Server, token string) {
	r.registerGRPC(s, func() string { return token })
}

// registerGRPC is RegisterGRPC with the token asked for at each call (a
// token re-read from its file).
func (r *Router) registerGRPC(s *grpc.Server, token func() string) {
	pb.RegisterPickerServer(s, &grpcPicker{r: r, token: token})
}

func (g *grpcPicker) Pick(ctx context.Context, req *pb.PickRequest) (*pb.PickResponse, error) {
	if token := g.token(); token != "" {
		md, _ := metadata.FromIncomingContext(ctx)
		hdr := http.Header{}
		for _, v := range md.Get("authorization") {
			hdr.Add("Authorization", v)
		}
		if !authorized(&http.Request{Header: hdr}, token) {
			g.r.m.refused.WithLabelValues("unauthorized").Inc()
			return nil, status.Error(codes.Unauthenticated, "the decision API needs a valid bearer token")
		}
	}
	if int64(len(req.GetBody())) > g.r.cfg.MaxBodyBytes {
		g.r.m.refused.WithLabelValues("too_large").Inc()
		return nil, status.Error(codes.InvalidArgument, "the request body is larger than this picker accepts (--max-body-bytes)")
	}
	body := req.GetBody()
	if h := g.r.cfg.TenantHeader; h != "" { // the tenant as gRPC metadata of the same name
		md, _ := metadata.FromIncomingContext(ctx)
		hdr := http.Header{}
		for _, v := range md.Get(strings.ToLower(h)) {
			hdr.Add(h, v)
		}
		var err error
		if body, err = g.r.tenantBody(&http.Request{Header: hdr}, body, true); err != nil {
			return nil, grpcError(err)
		}
	}
	slo := req.GetSloTtftMs()
	if slo < 0 || slo > float64(maxSLO/time.Millisecond) || math.IsNaN(slo) {
		return nil, status.Errorf(codes.InvalidArgument, "slo_ttft_ms %v: want 0 (none) or a number of milliseconds up to %d", slo, maxSLO/time.Millisecond)
	}
	opt := PickOptions{CacheOff: req.GetCacheOff(), Explain: req.GetExplain(), SLO: time.Duration(slo * float64(time.Millisecond))}
	if g.r.cfg.AdmitDecisions || g.r.prio != nil { // the fairness headers as gRPC metadata of their names
		md, _ := metadata.FromIncomingContext(ctx)
		hdr := http.Header{}
		for _, name := range []string{g.r.cfg.FairnessHeader, PriorityHeader} {
			for _, v := range md.Get(strings.ToLower(name)) {
				hdr.Add(name, v)
			}
		}
		opt.AdmitNow, opt.Fairness = g.r.cfg.AdmitDecisions, decisionFairness(hdr, g.r.cfg.FairnessHeader)
	}
	p, err := g.r.Route(ctx, intake.Any, body, opt)
	if err != nil {
		if s := retryAfterOf(err); s != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after", s))
		}
		return nil, grpcError(err)
	}
	return pickResponse(p), nil
}

// pickResponse is a pick as the gRPC decision API answers it: the HTTP
// API's answer, field for field.
func pickResponse(p *Pick) *pb.PickResponse {
	out := &pb.PickResponse{Endpoint: p.Endpoint, EndpointId: p.EndpointID, Model: p.Model, PromptTokens: int32(p.PromptTokens),
		MatchedTokens: int32(p.MatchedTokens), MatchedBlocks: int32(p.MatchedBlocks), PrefixHash: p.PrefixHash, Policy: p.Policy, Reason: p.Reason,
		PredictedTtftMs: p.PredictedTTFTMs, KvSource: p.KVSource, KvSourceTokens: int32(min(p.KVSourceTokens, math.MaxInt32))}
	if p.Priority != nil {
		out.Priority, out.HasPriority = int32(*p.Priority), true
	}
	for _, c := range p.Candidates {
		out.Candidates = append(out.Candidates, &pb.PickCandidate{Endpoint: c.Endpoint, MatchedTokens: int32(c.MatchedTokens),
			CpuMatchedTokens: int32(c.CPUTokens), StorageMatchedTokens: int32(c.StorageTokens), InFlight: c.InFlight,
			EstimatedCostTokens: c.Cost, UnderLoadCap: c.UnderCap, Why: c.Why, PredictedTtftMs: c.PredictedTTFTMs})
	}
	return out
}

// grpcError maps a refusal to a status whose message is the error body.
func grpcError(err error) error {
	var ie *intake.Error
	var re *render.RefusedError
	switch {
	case errors.As(err, &ie) && ie.Status == http.StatusTooManyRequests:
		// Overload: RESOURCE_EXHAUSTED, when to retry as a RetryInfo
		// detail (the retry-after metadata says it too).
		st := status.New(codes.ResourceExhausted, string(ie.Body()))
		if ie.RetryAfter > 0 {
			if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(ie.RetryAfter)}); derr == nil {
				st = d
			}
		}
		return st.Err()
	case errors.As(err, &ie):
		return status.Error(httpCode(ie.Status), string(ie.Body()))
	case errors.As(err, &re):
		return status.Error(httpCode(re.Status), strings.TrimSpace(string(re.Body)))
	}
	return status.Error(codes.Internal, err.Error())
}

func httpCode(s int) codes.Code {
	switch s {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return codes.InvalidArgument
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	}
	return codes.Unknown
}
