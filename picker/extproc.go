package picker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/extproc"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/tenant"
)

// The endpoint picker protocol's names (GIE, docs/proposals/004).
const (
	eppSubsetNamespace = "envoy.lb.subset_hint"
	eppSubsetKey       = "x-gateway-destination-endpoint-subset"
	eppNamespace       = "envoy.lb"
	eppDestination     = "x-gateway-destination-endpoint"
	eppServed          = "x-gateway-destination-endpoint-served"
	// maxSubset bounds the entries of a subset hint.
	maxSubset = 1 << 16
	// eppRoute is the route label and access-log route of the endpoint
	// picker's requests (kvroute_picker_requests_total).
	eppRoute = "ext_proc"
)

// Results of an endpoint picker request (kvroute_picker_extproc_requests_total).
const (
	eppPicked      = "picked"
	eppNoEndpoint  = "no_endpoint"
	eppSubsetEmpty = "subset_empty"
	eppShed        = "shed"
	eppRefused     = "refused"
	eppError       = "error"
)

// RegisterExtProc adds the endpoint picker to s: Envoy's
// envoy.service.ext_proc.v3.ExternalProcessor speaking the Gateway API
// Inference Extension's endpoint picker protocol (picker/extproc), and
// gRPC health for liveness, readiness and the ext_proc service name.
// ready, when set, is a readiness check besides knowing a routable
// endpoint (a gossip name conflict).
func (r *Router) RegisterExtProc(s *grpc.Server, cfg extproc.Config, ready func() error) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	extprocv3.RegisterExternalProcessorServer(s, &eppService{r: r, cfg: cfg, ready: ready})
	healthpb.RegisterHealthServer(s, &eppHealth{r: r, ready: ready, poll: time.Second})
	return nil
}

// ExtProcServerOptions are the gRPC server options the endpoint picker is
// served with, for request bodies of at most maxBody bytes: messages that
// large (a buffered body comes whole), panics recovered into INTERNAL
// errors, windows and buffers sized for bodies of tens of KiB, and
// ExtProcBufferPool.
func ExtProcServerOptions(maxBody int64, log *zap.Logger) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(int(maxBody) + 1<<20),
		grpc.InitialWindowSize(1 << 20), grpc.InitialConnWindowSize(8 << 20), grpc.WriteBufferSize(128 << 10), grpc.ReadBufferSize(128 << 10),
		grpc.ChainUnaryInterceptor(recoverUnary(log)), grpc.ChainStreamInterceptor(recoverStream(log)),
		experimental.BufferPool(ExtProcBufferPool())}
}

// ExtProcBufferPool is a gRPC buffer pool in power-of-two tiers from
// 256 B to 1 MiB that does not zero what it hands out (gRPC writes every
// byte of a buffer it uses). gRPC's default pool has no tier between
// 32 KiB and 1 MiB and zeroes a pooled buffer's whole capacity on each
// use: every message of a typical request body (tens of KiB) would cost
// clearing a MiB.
func ExtProcBufferPool() mem.BufferPool {
	return &tieredPool{}
}

// tieredPool is ExtProcBufferPool: tier i holds buffers of 1<<(i+8) bytes.
type tieredPool struct {
	tiers [13]sync.Pool
}

func (p *tieredPool) Get(n int) *[]byte {
	i := max(bits.Len(uint(max(n, 1)-1))-8, 0)
	if i >= len(p.tiers) {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.tiers[i].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(i+8))
	return &b
}

func (p *tieredPool) Put(b *[]byte) {
	c := cap(*b)
	if c < 1<<8 {
		return
	}
	i := bits.Len(uint(c)) - 1 - 8 // the largest tier the buffer fills
	if i < len(p.tiers) && c == 1<<(i+8) {
		p.tiers[i].Put(b)
	}
}

// eppService is the endpoint picker: one Process stream per HTTP request.
type eppService struct {
	extprocv3.UnimplementedExternalProcessorServer
	r     *Router
	cfg   extproc.Config
	ready func() error
}

// eppExchange is one stream's state besides its message flow.
type eppExchange struct {
	s      *eppService
	flow   *extproc.Flow
	subset []string // the gateway's subset hint, when it gave one
	// cacheOff: the request sent X-KVRoute-Cache: off (no prefix hash).
	cacheOff bool
	// fair are the request's admission and tenant headers (the fairness
	// header, PriorityHeader, SLOHeader and Config.TenantHeader), as
	// received.
	fair   http.Header
	hinted bool
	result string // the request's result, counted once at the end

	pick     *Pick
	route    []string // the destination list sent: the pick's address, then its fallbacks'
	inFlight prometheus.Gauge

	whole    chan struct{} // closed when the request is whole
	timedOut atomic.Bool   // it was not whole in time (Process)

	status int // the answer's, from its headers, or the refusal's
	sn     *sniffer
	out    *outputWatch // the answer's first output token, for FirstToken
	first  bool         // a chunk of the answer was seen
	ended  bool         // the answer was seen whole

	// For the request's metrics and access-log line, as the proxy's
	// (Router.record): its record, when its stream opened, whether its
	// headers came, its :method, when the answer's first body byte came
	// and the answer's body bytes.
	rec     *reqRecord
	start   time.Time
	seen    bool
	method  string
	firstAt time.Time
	bytes   int64
}

// Process serves one HTTP request's exchange. The exchange runs in its own
// goroutine, reading the stream directly, while this one bounds the wait
// for the request to come whole (Config.BodyTimeout): past it the stream
// ends with DEADLINE_EXCEEDED, which also ends the exchange's reads.
func (s *eppService) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &eppExchange{s: s, flow: extproc.NewFlow(s.r.cfg.MaxBodyBytes, s.cfg.Assumed()), whole: make(chan struct{}),
		rec: &reqRecord{cached: -1}, start: time.Now()}
	done := make(chan error, 1)
	go func() {
		var err error
		defer func() {
			// This goroutine is not the handler's: its panics are
			// recovered here, into an INTERNAL error.
			if p := recover(); p != nil {
				s.r.log.Error("panic in an ext_proc exchange", zap.Any("panic", p))
				err = status.Errorf(codes.Internal, "internal error")
			}
			x.finish() // counted and booked before the stream's status goes out
			done <- err
		}()
		err = x.serve(stream)
	}()
	timer := time.NewTimer(s.cfg.BodyTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-x.whole:
		return <-done
	case <-timer.C:
		x.timedOut.Store(true)
		s.r.m.eppRequests.WithLabelValues(eppError).Inc() // here: the exchange ends after this returns
		return status.Errorf(codes.DeadlineExceeded, "the request did not arrive whole within %v (--ext-proc-body-timeout)", s.cfg.BodyTimeout)
	}
}

// serve runs the exchange until the gateway ends it, an immediate response
// does, or the stream fails.
func (x *eppExchange) serve(stream extprocv3.ExternalProcessor_ProcessServer) error {
	s, ctx := x.s, stream.Context()
	for {
		req, err := stream.Recv()
		if err == io.EOF || status.Code(err) == codes.Canceled {
			return nil // the gateway is done with the request
		}
		if err != nil {
			return err
		}
		ev, err := x.take(req)
		if err != nil {
			x.result = eppError
			s.r.log.Debug("ext_proc: protocol error", zap.Error(err))
			return status.Error(codes.InvalidArgument, err.Error())
		}
		step, err := x.flow.Step(ev)
		if err != nil {
			x.result = eppError
			s.r.log.Debug("ext_proc: protocol error", zap.Error(err))
			return status.Error(codes.InvalidArgument, err.Error())
		}
		replies := step.Replies
		switch {
		case step.TooLarge:
			s.r.m.refused.WithLabelValues("too_large").Inc()
			x.result = eppRefused
			st, body := errorBody(&intake.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
				Message: fmt.Sprintf("The request body is larger than this picker accepts (%d bytes, --max-body-bytes).", s.r.cfg.MaxBodyBytes)})
			x.status = st
			replies, err = x.flow.Refuse(st, body)
		case step.Decide:
			replies, err = x.decide(ctx)
		}
		if step.TooLarge || step.Decide {
			close(x.whole) // the request is whole: its wait is over
		}
		if err != nil {
			x.result = eppError
			return err
		}
		if ev.Kind == extproc.ResponseBody {
			x.responseBody(ev.Data)
		}
		x.ended = x.ended || step.ResponseEnded
		if !req.GetObservabilityMode() { // in observability mode nothing is answered
			for _, rep := range replies {
				set, remove := x.decisionHeaders()
				if err := stream.Send(eppResponse(rep, set, remove)); err != nil {
					return err
				}
			}
		}
		if x.flow.Refused() {
			return nil // the immediate response ends the exchange
		}
	}
}

// take reads one message: the protocol the gateway announces, the subset
// hint on the request headers, the status and served endpoint on the
// response headers; and returns it as the flow's event.
func (x *eppExchange) take(req *extprocv3.ProcessingRequest) (extproc.Event, error) {
	if pc := req.GetProtocolConfig(); pc != nil {
		x.flow.Configure(extproc.Protocol{RequestBody: extproc.Mode(pc.GetRequestBodyMode()), ResponseBody: extproc.Mode(pc.GetResponseBodyMode()),
			BodyWithoutWaiting: pc.GetSendBodyWithoutWaitingForHeaderResponse()})
	}
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if err := x.readSubset(req); err != nil {
			return extproc.Event{}, err
		}
		x.seen = true
		var id string
		for _, h := range v.RequestHeaders.GetHeaders().GetHeaders() {
			switch k := h.GetKey(); {
			case k == ":method":
				x.method = string(h.GetRawValue()) + h.GetValue()
			case strings.EqualFold(k, "x-request-id"):
				id = string(h.GetRawValue()) + h.GetValue()
			case strings.EqualFold(k, "x-kvroute-cache"):
				x.cacheOff = strings.EqualFold(strings.TrimSpace(string(h.GetRawValue())+h.GetValue()), "off")
			case strings.EqualFold(k, x.s.r.cfg.FairnessHeader), strings.EqualFold(k, PriorityHeader), strings.EqualFold(k, SLOHeader),
				x.s.r.cfg.TenantHeader != "" && strings.EqualFold(k, x.s.r.cfg.TenantHeader):
				if x.fair == nil {
					x.fair = http.Header{}
				}
				x.fair.Add(k, string(h.GetRawValue())+h.GetValue())
			}
		}
		x.rec.id = requestID(id)
		return extproc.Event{Kind: extproc.RequestHeaders, EndOfStream: v.RequestHeaders.GetEndOfStream()}, nil
	case *extprocv3.ProcessingRequest_RequestBody:
		return extproc.Event{Kind: extproc.RequestBody, EndOfStream: v.RequestBody.GetEndOfStream(), Data: v.RequestBody.GetBody()}, nil
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return extproc.Event{Kind: extproc.RequestTrailers}, nil
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if x.flow.Decided() && x.sn == nil {
			x.responseHeaders(req, v.ResponseHeaders)
		}
		return extproc.Event{Kind: extproc.ResponseHeaders, EndOfStream: v.ResponseHeaders.GetEndOfStream()}, nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		return extproc.Event{Kind: extproc.ResponseBody, EndOfStream: v.ResponseBody.GetEndOfStream(), Data: v.ResponseBody.GetBody()}, nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return extproc.Event{Kind: extproc.ResponseTrailers}, nil
	}
	return extproc.Event{}, errors.New("a message without a request, response or trailers")
}

// readSubset reads the gateway's subset hint: filter metadata
// envoy.lb.subset_hint, key x-gateway-destination-endpoint-subset, a list
// of ip:port strings (or one string of them, comma-separated, as a
// header-to-metadata filter writes it).
func (x *eppExchange) readSubset(req *extprocv3.ProcessingRequest) error {
	ns := req.GetMetadataContext().GetFilterMetadata()[eppSubsetNamespace]
	v, ok := ns.GetFields()[eppSubsetKey]
	if !ok {
		return nil
	}
	x.hinted = true
	var raw []string
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		raw = []string{k.StringValue}
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			raw = append(raw, e.GetStringValue()) // a non-string entry names nothing
		}
	}
	for _, r := range raw {
		for _, e := range strings.Split(r, ",") {
			if e = strings.TrimSpace(e); e != "" {
				if len(x.subset) == maxSubset {
					return fmt.Errorf("the endpoint subset hint has more than %d entries", maxSubset)
				}
				x.subset = append(x.subset, e)
			}
		}
	}
	return nil
}

// decide picks the request's endpoints (or refuses it) and returns the
// flow's answers.
func (x *eppExchange) decide(ctx context.Context) ([]extproc.Reply, error) {
	r, cfg := x.s.r, &x.s.cfg
	refuse := func(result string, err error) ([]extproc.Reply, error) {
		x.result = result
		st, body := errorBody(err)
		x.status = st
		out, ferr := x.flow.Refuse(st, body)
		if len(out) == 1 {
			out[0].RetryAfter = retryAfterOf(err)
		}
		return out, ferr
	}
	notReady := &intake.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_healthy_endpoint",
		Message: "No endpoint is ready right now."}
	var only map[string]bool
	if x.hinted {
		if only = r.subsetEndpoints(x.subset); len(only) == 0 {
			return refuse(eppSubsetEmpty, &intake.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_endpoint_in_subset",
				Message: fmt.Sprintf("None of the %d endpoints of the gateway's subset hint is an endpoint this picker routes to.", len(x.subset))})
		}
	}
	body := x.flow.Body()
	members, err := x.bodyMembers(body != nil)
	if err != nil {
		return refuse(eppRefused, err)
	}
	if len(members) > 0 && body != nil {
		if body, err = r.setMembers(body, members...); err != nil {
			return refuse(eppRefused, err)
		}
		if err := x.flow.Rewrite(body); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	var p *Pick
	if body == nil {
		// No body to route by: the least loaded routable endpoint.
		if p = r.pickAny(only, cfg.Fallbacks); p == nil {
			return refuse(eppNoEndpoint, notReady)
		}
	} else {
		fair, err := fairnessOf(x.fair, r.cfg.FairnessHeader)
		var slo time.Duration
		if err == nil {
			slo, err = sloOf(x.fair)
		}
		if err != nil {
			r.m.refused.WithLabelValues("bad_request").Inc()
			return refuse(eppRefused, err)
		}
		// The record takes the model the preparation resolves.
		p, err = r.Route(context.WithValue(ctx, recordKey{}, x.rec), intake.Any, body, PickOptions{Only: only, Fallbacks: cfg.Fallbacks, ShedWaiting: cfg.ShedWaiting, CacheOff: x.cacheOff,
			Admit: true, Fairness: fair, Carried: true, SLO: slo})
		var ie *intake.Error
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil, status.FromContextError(ctx.Err()).Err()
		case errors.As(err, &ie) && ie.Status == http.StatusTooManyRequests:
			return refuse(eppShed, err)
		case isNoEndpoint(err):
			return refuse(eppNoEndpoint, err)
		case r.readiness(nil) != nil:
			// No endpoint is routable at all (so no model is known
			// either): the protocol's 503, not the model's 404.
			return refuse(eppNoEndpoint, notReady)
		case isRefusal(err):
			return refuse(eppRefused, err)
		default:
			r.log.Debug("ext_proc: decision failed", zap.Error(err))
			return refuse(eppError, err)
		}
	}
	if err := x.setPriority(p, body); err != nil {
		r.Done(p)
		return nil, status.Error(codes.Internal, err.Error())
	}
	x.route = append(x.route[:0], gatewayAddr(p.Endpoint))
	for _, f := range p.fallbacks {
		x.route = append(x.route, gatewayAddr(f.endpoint))
	}
	replies, err := x.flow.Route(strings.Join(x.route, ","))
	if err != nil {
		r.Done(p)
		return nil, status.Error(codes.Internal, err.Error())
	}
	x.pick, x.result = p, eppPicked
	x.rec.endpoint, x.rec.attempts, x.rec.prompt, x.rec.matched, x.rec.kvSource = p.Endpoint, 1, p.PromptTokens, p.MatchedTokens, p.KVSource
	x.inFlight = r.m.inFlight.WithLabelValues(p.Endpoint)
	x.inFlight.Inc()
	return replies, nil
}

// setPriority puts the decision's priority (--engine-priority) in the
// body sent on, replacing any the client sent; nothing without one. An
// engine that refuses it (fcfs) answers the gateway's client 400: the
// endpoint picker cannot resend, so every engine must run
// --scheduling-policy priority.
func (x *eppExchange) setPriority(p *Pick, body []byte) error {
	if p.Priority == nil || body == nil {
		return nil
	}
	b, err := tenant.SetMembers(body, tenant.Int(priorityKey, *p.Priority))
	if err != nil {
		return err
	}
	return x.flow.Rewrite(b)
}

// bodyMembers are the top-level members the endpoint picker sets on the
// request body it sends on (hasBody), each replacing any the client sent,
// all in one rewrite (the content-length set to match): the tenant's
// cache_salt (Config.TenantHeader, as the proxy sets it). Another member
// is one more append here. The error is the tenant header's refusal
// (401 without it under Config.RequireTenant, 400 a bad one), checked
// for a request without a body too.
func (x *eppExchange) bodyMembers(hasBody bool) ([]tenant.Member, error) {
	members, err := x.s.r.tenantMembers(x.fair, hasBody)
	if err != nil {
		return nil, err
	}
	return members, nil
}

// responseHeaders reads the answer's status and type, and which endpoint
// served it: filter metadata envoy.lb, key
// x-gateway-destination-endpoint-served (or a response header of that
// name). A fallback's serving moves the pick to it.
func (x *eppExchange) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) {
	var served, contentType string
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := hv.GetValue()
		if raw := hv.GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		switch strings.ToLower(hv.GetKey()) {
		case ":status":
			x.status, _ = strconv.Atoi(v)
		case "content-type":
			contentType = v
		case eppServed:
			served = v
		}
	}
	if v := req.GetMetadataContext().GetFilterMetadata()[eppNamespace].GetFields()[eppServed].GetStringValue(); v != "" {
		served = v
	}
	x.sn = &sniffer{sse: strings.HasPrefix(contentType, "text/event-stream"), kind: x.pick.kind, limit: 4 << 20}
	x.out = newOutputWatch(x.pick.kind, x.sn.sse)
	r := x.s.r
	served = strings.TrimSpace(served)
	k := -1
	for i, a := range x.route {
		if a == served {
			k = i
			break
		}
	}
	switch {
	case served == "":
		r.m.eppServed.WithLabelValues("unreported").Inc()
	case k == 0:
		r.m.eppServed.WithLabelValues("picked").Inc()
	case k > 0:
		r.m.eppServed.WithLabelValues("fallback").Inc()
		failed := x.pick.Endpoint
		x.inFlight.Dec()
		r.servedBy(x.pick, k-1)
		x.rec.endpoint, x.rec.attempts, x.rec.matched = x.pick.Endpoint, k+1, x.pick.MatchedTokens
		x.inFlight = r.m.inFlight.WithLabelValues(x.pick.Endpoint)
		x.inFlight.Inc()
		// The gateway goes down the list only when an endpoint failed.
		r.reportFailure(failed, "ext_proc: the gateway served the request from a fallback")
	default:
		r.m.eppServed.WithLabelValues("other").Inc()
		x.pick.relay = true // not ours: nothing to judge the answer by
	}
}

// responseBody watches a chunk of the answer for its usage.
func (x *eppExchange) responseBody(chunk []byte) {
	if len(chunk) > 0 && x.firstAt.IsZero() {
		x.firstAt = time.Now()
	}
	x.bytes += int64(len(chunk))
	if x.sn == nil || x.pick == nil {
		return
	}
	if len(chunk) > 0 && !x.first {
		x.s.r.firstChunk(x.pick) // kvroute's prefill in flight ends; llm-d's tokens too
	}
	if x.out.see(chunk) {
		x.s.r.firstToken(x.pick, x.sn.sse) // the first output token: Dynamo's prefill ends; the TTFT model learns
	}
	x.first = x.first || len(chunk) > 0
	_, _ = x.sn.Write(chunk)
}

// finish ends the exchange: the result counted, the answer's usage
// accounted (a whole 200), the pick's in-flight record ended, and the
// request recorded as the proxy records one (record).
func (x *eppExchange) finish() {
	r := x.s.r
	if x.result != "" && !x.timedOut.Load() { // a timeout was counted by Process
		r.m.eppRequests.WithLabelValues(x.result).Inc()
	}
	if p := x.pick; p != nil {
		if x.ended && x.status == http.StatusOK && x.sn != nil && x.sn.complete() && !p.relay {
			u := x.sn.result()
			if u.Seen {
				x.rec.cached = u.Cached
			}
			r.account(p, u)
		}
		x.inFlight.Dec()
		r.Done(p)
		x.rec.predictedMs, x.rec.observedTTFT = p.PredictedTTFTMs, p.ObservedTTFT
	}
	x.record()
}

// record counts the request in kvroute_picker_requests_total (route
// ext_proc; code the answer's status, or the refusal's, "unreported" when
// the gateway did not send the answer's headers back) with its duration
// (the stream's) and time to first byte (the answer's first body byte),
// and writes its access-log line, as the proxy does (Router.record), with
// via ext_proc and the result. A stream on which no request came is none.
func (x *eppExchange) record() {
	if !x.seen {
		return
	}
	result := x.result
	if x.timedOut.Load() {
		result = eppError
	}
	code, status := "unreported", x.status
	if status > 0 {
		code = strconv.Itoa(status)
	}
	var ttfb time.Duration
	if !x.firstAt.IsZero() {
		ttfb = x.firstAt.Sub(x.start)
	}
	dur := time.Since(x.start)
	x.s.r.record(eppRoute, code, x.rec, dur, ttfb, func() []zap.Field {
		f := []zap.Field{zap.String("request_id", x.rec.id), zap.String("method", x.method), zap.String("route", eppRoute),
			zap.String("via", "ext_proc"), zap.String("result", result)}
		if status > 0 {
			f = append(f, zap.Int("status", status))
		}
		return append(f, zap.Duration("duration", dur), zap.Int64("bytes", x.bytes))
	}, false)
}

// decisionHeaders are the decision's headers the routing answer adds to
// the request (set), as the proxy adds them to its answers: the prefix
// hash (when the request has one and did not opt out) and the matched
// tokens, for the gateway's logs or its own hash balancing; and the KV
// source, as llm-d's routing sidecar reads it (KVSourceHeader, host:port),
// when the decision named one. Without a source, that header is removed
// (remove): a client never names one. Both nil before a pick.
func (x *eppExchange) decisionHeaders() (set []*corev3.HeaderValueOption, remove []string) {
	if x.pick == nil {
		return nil, nil
	}
	out := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-kvroute-matched-tokens", RawValue: []byte(strconv.Itoa(x.pick.MatchedTokens))}},
		// The request's id, as the access log names it (the client's when
		// it is one the picker carries), on the request sent on.
		{Header: &corev3.HeaderValue{Key: "x-request-id", RawValue: []byte(x.rec.id)}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}}
	if x.pick.KVSource != "" {
		// Set, not appended: it replaces any the client sent.
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: KVSourceHeader, RawValue: []byte(x.pick.KVSource)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	} else {
		remove = []string{KVSourceHeader}
	}
	if x.pick.PrefixHash != "" {
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-kvroute-prefix-hash", RawValue: []byte(x.pick.PrefixHash)}})
	}
	if x.pick.PredictedTTFTMs > 0 {
		out = append(out, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-kvroute-predicted-ttft-ms", RawValue: []byte(predictedMs(x.pick))}})
	}
	return out, remove
}

// eppResponse is a reply on the wire; a routing answer also sets the
// decision's headers and removes those in remove.
func eppResponse(rep extproc.Reply, decision []*corev3.HeaderValueOption, remove []string) *extprocv3.ProcessingResponse {
	out := &extprocv3.ProcessingResponse{}
	if rep.Kind == extproc.Immediate {
		out.Response = &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(rep.Status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}}}},
			Body: rep.Body, Details: "kvroute_picker_refused"}}
		if rep.RetryAfter != "" {
			h := out.GetImmediateResponse().Headers
			h.SetHeaders = append(h.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "retry-after", RawValue: []byte(rep.RetryAfter)}})
		}
		return out
	}
	common := &extprocv3.CommonResponse{ClearRouteCache: rep.ClearRouteCache}
	if rep.Route != "" {
		set := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: eppDestination, RawValue: []byte(rep.Route)}}}
		if rep.ContentLength > 0 {
			set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(rep.ContentLength))}})
		}
		set = append(set, decision...)
		common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove}
		out.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{eppNamespace: structpb.NewStructValue(
			&structpb.Struct{Fields: map[string]*structpb.Value{eppDestination: structpb.NewStringValue(rep.Route)}})}}
	}
	if rep.Replace {
		if len(rep.Chunk) > 0 {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: rep.Chunk}}
		} else {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}}
		}
	}
	if rep.Streamed {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: rep.Chunk, EndOfStream: rep.EndOfStream}}}
	}
	if rep.ModeOverride != 0 {
		out.ModeOverride = &filterv3.ProcessingMode{RequestBodyMode: filterv3.ProcessingMode_BodySendMode(rep.ModeOverride)}
	}
	switch rep.Kind {
	case extproc.RequestHeaders:
		out.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
	case extproc.RequestBody:
		out.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	case extproc.RequestTrailers:
		out.Response = &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}
	case extproc.ResponseHeaders:
		out.Response = &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: common}}
	case extproc.ResponseBody:
		out.Response = &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: common}}
	case extproc.ResponseTrailers:
		out.Response = &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}
	}
	return out
}

// gatewayAddr is the gateway's name for an endpoint: the host:port of its
// engine URL (the sidecar's --engine-url, http://<podIP>:<port>), the
// port defaulting by scheme, an IP written canonically (IPv6 in
// brackets, as Envoy writes an address). A URL without a host is
// returned as it is (it cannot be routed to by a gateway).
func gatewayAddr(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return endpoint
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.String()
	}
	return net.JoinHostPort(host, port)
}

// subsetEndpoints are the endpoints a gateway's subset hint names: an
// ip:port entry names that endpoint, a bare IP every port of the pod (its
// data-parallel ranks). IPs compare canonically.
func (r *Router) subsetEndpoints(hint []string) map[string]bool {
	addrs, hosts := map[string]bool{}, map[string]bool{}
	for _, e := range hint {
		if ap, err := netip.ParseAddrPort(e); err == nil {
			addrs[ap.String()] = true
		} else if ip, err := netip.ParseAddr(e); err == nil {
			hosts[ip.String()] = true
		} else {
			addrs[e] = true // a name, compared as written
		}
	}
	only := map[string]bool{}
	for _, e := range r.fleet.Endpoints() {
		a := gatewayAddr(e.URL)
		host, _, _ := net.SplitHostPort(a)
		if addrs[a] || hosts[host] {
			only[e.URL] = true
		}
	}
	return only
}

// pickAny picks for a request without a body: the least loaded routable
// endpoint of any group (only those in only, when set), with fallbacks
// after it in the same order; booked in flight, nothing to predict.
func (r *Router) pickAny(only map[string]bool, fallbacks int) *Pick {
	eps := r.fleet.Endpoints()
	if only != nil {
		var kept []fleet.Endpoint
		for _, e := range eps {
			if only[e.URL] {
				kept = append(kept, e)
			}
		}
		eps = kept
	}
	now := r.now()
	urls := decide.RenderOrder(&r.dcfg, eps, now)
	if len(urls) == 0 {
		return nil
	}
	p := relayPick(urls[0])
	for _, u := range urls[1:min(len(urls), fallbacks+1)] {
		p.fallbacks = append(p.fallbacks, fallback{endpoint: u, loadOnly: true})
	}
	r.bookings.book(p, 0, false, now)
	return p
}

// eppHealth serves grpc.health.v1 for the endpoint picker: liveness (and
// the server as a whole, "") is SERVING while the process answers;
// readiness and the ext_proc service are SERVING while the picker can
// route (Router.readiness), NOT_SERVING otherwise.
type eppHealth struct {
	healthpb.UnimplementedHealthServer
	r     *Router
	ready func() error
	poll  time.Duration // how often Watch looks again
}

func (h *eppHealth) status(service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	switch service {
	case "", "liveness":
		return healthpb.HealthCheckResponse_SERVING, nil
	case "readiness", extprocv3.ExternalProcessor_ServiceDesc.ServiceName:
		if h.r.readiness(h.ready) != nil {
			return healthpb.HealthCheckResponse_NOT_SERVING, nil
		}
		return healthpb.HealthCheckResponse_SERVING, nil
	}
	return healthpb.HealthCheckResponse_SERVICE_UNKNOWN, status.Errorf(codes.NotFound, "unknown service %q: this server checks liveness, readiness and %s",
		service, extprocv3.ExternalProcessor_ServiceDesc.ServiceName)
}

func (h *eppHealth) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st, err := h.status(req.GetService())
	if err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// Watch sends the service's status, then each change, looking again every
// poll until the caller leaves.
func (h *eppHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	tick := time.NewTicker(h.poll)
	defer tick.Stop()
	for {
		st, _ := h.status(req.GetService()) // an unknown service is watched as SERVICE_UNKNOWN
		if st != last {
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-tick.C:
		}
	}
}
