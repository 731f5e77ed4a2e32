package picker_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/extproc"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/enginesim"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// The conformance suite drives the endpoint picker over real gRPC as
// Envoy's ext_proc filter does (the go-control-plane types, the message
// sequences of each body mode), with real simulated engines and sidecars
// behind it: the test plays the gateway, sends each request to the
// endpoint the picker names itself, and feeds the engine's answer back
// through the stream.

// serveEPP serves r's endpoint picker on 127.0.0.1 and returns a client
// connection, both closed when the test ends.
func serveEPP(t testing.TB, r *picker.Router, cfg extproc.Config, extra ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer(append(picker.ExtProcServerOptions(32<<20, zap.NewNop()), extra...)...)
	if err := r.RegisterExtProc(srv, cfg, nil); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	// The gateway's side: Envoy's own allocator, not gRPC-Go's default
	// pool (see ExtProcServerOptions), so the test client's costs do not
	// dwarf the picker's.
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(32<<20)), experimental.WithBufferPool(picker.ExtProcBufferPool()),
		grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(8<<20), grpc.WithWriteBufferSize(128<<10), grpc.WithReadBufferSize(128<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// gateway is one ext_proc stream, as Envoy's filter holds it: one per
// HTTP request, every receive bounded.
type gateway struct {
	t      testing.TB
	stream extprocv3.ExternalProcessor_ProcessClient
	mode   filterv3.ProcessingMode_BodySendMode
	// set are the request headers the routing answer set, removed those
	// it removed.
	set     map[string]string
	removed []string
	// extra are request headers sent besides the usual ones.
	extra []*corev3.HeaderValue
}

func openGateway(t testing.TB, conn *grpc.ClientConn, mode filterv3.ProcessingMode_BodySendMode) *gateway {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &gateway{t: t, stream: s, mode: mode}
}

func (g *gateway) send(m *extprocv3.ProcessingRequest) {
	g.t.Helper()
	if err := g.stream.Send(m); err != nil {
		g.t.Fatalf("send: %v", err)
	}
}

func (g *gateway) recv() *extprocv3.ProcessingResponse {
	g.t.Helper()
	m, err := g.stream.Recv()
	if err != nil {
		g.t.Fatalf("recv: %v", err)
	}
	return m
}

// end closes the gateway's side and waits for the picker to end the
// stream cleanly.
func (g *gateway) end() {
	g.t.Helper()
	_ = g.stream.CloseSend()
	if m, err := g.stream.Recv(); err != io.EOF {
		g.t.Fatalf("after the exchange: %v %v, want the end of the stream", m, err)
	}
}

func header(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

// requestHeaders is the first message: the request's headers, Envoy's
// protocol_config, and the subset hint when one is given (a []string
// list, or a string).
func (g *gateway) requestHeaders(eos bool, subset any) *extprocv3.ProcessingRequest {
	m := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: eos,
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{header(":method", "POST"), header(":path", "/v1/chat/completions"),
				header("content-type", "application/json")}}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: g.mode, ResponseBodyMode: g.mode,
			SendBodyWithoutWaitingForHeaderResponse: g.mode == filterv3.ProcessingMode_STREAMED},
	}
	h := m.GetRequestHeaders().GetHeaders()
	h.Headers = append(h.Headers, g.extra...)
	if subset != nil {
		var v *structpb.Value
		switch s := subset.(type) {
		case string:
			v = structpb.NewStringValue(s)
		case []string:
			var l []*structpb.Value
			for _, e := range s {
				l = append(l, structpb.NewStringValue(e))
			}
			v = structpb.NewListValue(&structpb.ListValue{Values: l})
		}
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.lb.subset_hint": {Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint-subset": v}}}}
	}
	return m
}

func requestBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// chunks splits b in n pieces, as a gateway streams a body.
func chunks(b []byte, n int) [][]byte {
	var out [][]byte
	size := (len(b) + n - 1) / n
	for i := 0; i < len(b); i += size {
		out = append(out, b[i:min(i+size, len(b))])
	}
	return out
}

// routeOf checks that a response sets the destination, in the header and
// the envoy.lb metadata alike, and returns it.
func routeOf(t testing.TB, m *extprocv3.ProcessingResponse, common *extprocv3.CommonResponse) string {
	t.Helper()
	var hdr string
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-gateway-destination-endpoint" {
			hdr = string(h.GetHeader().GetRawValue())
		}
	}
	md := m.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue()
	if hdr == "" || hdr != md || !common.GetClearRouteCache() {
		t.Fatalf("destination header %q, metadata %q, clear_route_cache %v: %v", hdr, md, common.GetClearRouteCache(), m)
	}
	return hdr
}

// setHeaders are the request headers a routing answer sets.
func setHeaders(common *extprocv3.CommonResponse) map[string]string {
	out := map[string]string{}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		out[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	return out
}

// immediate checks that m is an immediate response and returns its
// status and OpenAI error code.
func immediate(t testing.TB, m *extprocv3.ProcessingResponse) (int, string) {
	t.Helper()
	ir := m.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("want an immediate response, got %v", m)
	}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &body); err != nil || body.Error.Message == "" {
		t.Fatalf("the body is not an OpenAI error: %s (%v)", ir.GetBody(), err)
	}
	ct := ""
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "content-type" {
			ct = string(h.GetHeader().GetRawValue())
		}
	}
	if ct != "application/json" {
		t.Fatalf("immediate response content-type %q", ct)
	}
	return int(ir.GetStatus().GetCode()), body.Error.Code
}

// sendRequest drives a request through the picker in the gateway's body
// mode, checks each answer as that mode wants it, and returns the
// destination list. refused, when true, expects the immediate response
// instead and returns it.
func (g *gateway) sendRequest(body []byte, subset any) (string, *extprocv3.ProcessingResponse) {
	t := g.t
	t.Helper()
	g.send(g.requestHeaders(false, subset))
	switch g.mode {
	case filterv3.ProcessingMode_BUFFERED:
		// The headers are answered at once, unrouted; the whole body's
		// answer carries the destination.
		if h := g.recv(); h.GetRequestHeaders() == nil || h.GetRequestHeaders().GetResponse().GetHeaderMutation() != nil {
			t.Fatalf("buffered: the headers' answer %v", h)
		}
		g.send(requestBody(body, true))
		m := g.recv()
		if m.GetImmediateResponse() != nil {
			return "", m
		}
		if m.GetRequestBody() == nil || m.GetRequestBody().GetResponse().GetBodyMutation() != nil {
			t.Fatalf("buffered: the body's answer %v", m)
		}
		g.set = setHeaders(m.GetRequestBody().GetResponse())
		g.removed = m.GetRequestBody().GetResponse().GetHeaderMutation().GetRemoveHeaders()
		return routeOf(t, m, m.GetRequestBody().GetResponse()), nil
	case filterv3.ProcessingMode_STREAMED:
		// Sent without waiting: the headers are held until the body is
		// whole, then answered routed, then each chunk unchanged.
		parts := chunks(body, 3)
		for i, c := range parts {
			g.send(requestBody(c, i == len(parts)-1))
		}
		m := g.recv()
		if m.GetImmediateResponse() != nil {
			return "", m
		}
		if m.GetRequestHeaders() == nil {
			t.Fatalf("streamed: want the headers' answer first, got %v", m)
		}
		route := routeOf(t, m, m.GetRequestHeaders().GetResponse())
		g.set = setHeaders(m.GetRequestHeaders().GetResponse())
		g.removed = m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders()
		for range parts {
			if b := g.recv(); b.GetRequestBody() == nil || b.GetRequestBody().GetResponse().GetBodyMutation() != nil {
				t.Fatalf("streamed: a chunk's answer %v", b)
			}
		}
		return route, nil
	}
	// FULL_DUPLEX_STREAMED: chunks accumulate unanswered; then the headers
	// with the destination and the body's length, then the body streamed
	// back whole.
	parts := chunks(body, 3)
	for i, c := range parts {
		g.send(requestBody(c, i == len(parts)-1))
	}
	m := g.recv()
	if m.GetImmediateResponse() != nil {
		return "", m
	}
	if m.GetRequestHeaders() == nil {
		t.Fatalf("full duplex: want the headers' answer first, got %v", m)
	}
	common := m.GetRequestHeaders().GetResponse()
	route := routeOf(t, m, common)
	g.set = setHeaders(common)
	g.removed = common.GetHeaderMutation().GetRemoveHeaders()
	cl := ""
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "content-length" {
			cl = string(h.GetHeader().GetRawValue())
		}
	}
	if cl != fmtInt(len(body)) {
		t.Fatalf("full duplex: content-length %q for a %d-byte body", cl, len(body))
	}
	var back []byte
	for {
		b := g.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if b == nil {
			t.Fatal("full duplex: want the body streamed back")
		}
		back = append(back, b.GetBody()...)
		if b.GetEndOfStream() {
			break
		}
	}
	if !bytes.Equal(back, body) {
		t.Fatalf("full duplex: the body sent back differs (%d bytes of %d)", len(back), len(body))
	}
	return route, nil
}

func fmtInt(n int) string { b, _ := json.Marshal(n); return string(b) }

// forward sends the request to the endpoint the gateway picked, as the
// gateway would, and returns the engine's answer.
func forward(t testing.TB, addr, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, raw
}

// sendResponse feeds an engine's answer back through the stream, the
// served endpoint in envoy.lb metadata, and checks each answer; then ends
// the exchange.
func (g *gateway) sendResponse(served string, resp *http.Response, body []byte) {
	t := g.t
	t.Helper()
	m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{header(":status", fmtInt(resp.StatusCode)),
			header("content-type", resp.Header.Get("Content-Type"))}}}}}
	if served != "" {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.lb": {Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint-served": structpb.NewStringValue(served)}}}}
	}
	g.send(m)
	if h := g.recv(); h.GetResponseHeaders() == nil {
		t.Fatalf("want the response headers' answer, got %v", h)
	}
	parts := chunks(body, 4)
	var back []byte
	for i, c := range parts {
		g.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: c, EndOfStream: i == len(parts)-1}}})
		r := g.recv().GetResponseBody()
		if r == nil {
			t.Fatal("want a response body answer")
		}
		if g.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			s := r.GetResponse().GetBodyMutation().GetStreamedResponse()
			if s == nil || s.GetEndOfStream() != (i == len(parts)-1) {
				t.Fatalf("full duplex: chunk %d not streamed back as it came: %v", i, r)
			}
			back = append(back, s.GetBody()...)
		} else if r.GetResponse().GetBodyMutation() != nil {
			t.Fatalf("the answer's body was changed: %v", r)
		}
	}
	if g.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !bytes.Equal(back, body) {
		t.Fatal("full duplex: the answer sent back differs")
	}
	g.end()
}

func modes() []filterv3.ProcessingMode_BodySendMode {
	return []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED}
}

// engineAddrs maps the fleet's engines to the gateway's addresses.
func engineAddrs(f *fleet) []string {
	var out []string
	for _, e := range f.engines {
		out = append(out, strings.TrimPrefix(e.URL(), "http://"))
	}
	return out
}

// TestEPPBodyModes: in each body mode the picker answers in that mode's
// sequence with the picked endpoint and two fallbacks (three distinct
// engines, header and metadata alike), the answer's usage is read back
// from the response body into the outcome metrics, and the served
// endpoint is counted.
func TestEPPBodyModes(t *testing.T) {
	f := startFleet(t, 3, picker.DefaultConfig(), "")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	for i, mode := range modes() {
		t.Run(mode.String(), func(t *testing.T) {
			g := openGateway(t, conn, mode)
			body := chatBody("modes", strings.Repeat("Tell me about body modes. ", 20), fmtInt(i))
			route, refused := g.sendRequest([]byte(body), nil)
			if refused != nil {
				t.Fatalf("refused: %v", refused)
			}
			list := strings.Split(route, ",")
			if len(list) != 3 || len(slices.Compact(slices.Sorted(slices.Values(list)))) != 3 {
				t.Fatalf("route %q: want the pick and two distinct fallbacks", route)
			}
			for _, a := range list {
				if !slices.Contains(engineAddrs(f), a) {
					t.Fatalf("route entry %q is no engine's address (%v)", a, engineAddrs(f))
				}
			}
			outcomes := counter(t, f.reg, "kvroute_picker_outcomes_total")
			resp, raw := forward(t, list[0], body)
			if resp.StatusCode != 200 || !openai.UsageOf(raw).Seen {
				t.Fatalf("engine: %d %s", resp.StatusCode, raw)
			}
			g.sendResponse(list[0], resp, raw)
			if n := counter(t, f.reg, "kvroute_picker_outcomes_total"); n != outcomes+1 {
				t.Fatalf("outcomes %v → %v: the answer's usage was not accounted", outcomes, n)
			}
			if n := gauge(t, f.reg, "kvroute_picker_extproc_served_total", "as", "picked"); n != float64(i+1) {
				t.Fatalf("served as picked: %v", n)
			}
			if n := gauge(t, f.reg, "kvroute_picker_endpoint_requests_in_flight", "", ""); n != 0 {
				t.Fatalf("%v requests still in flight after the exchange", n)
			}
		})
	}
	if n := gauge(t, f.reg, "kvroute_picker_extproc_requests_total", "result", "picked"); n != 3 {
		t.Fatalf("picked: %v", n)
	}
	if n := counter(t, f.reg, "kvroute_picker_decisions_total"); n != 3 {
		t.Fatalf("decisions: %v", n)
	}
}

// TestEPPStripsClientKVSource: in every body mode, a client's
// x-kv-cache-source-host-port (llm-d's routing sidecar would pull from
// the host it names) is removed by the routing answer, and no source is
// set when the decision named none (no endpoint runs a P2P tier here).
func TestEPPStripsClientKVSource(t *testing.T) {
	f := startFleet(t, 2, picker.DefaultConfig(), "")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	for i, mode := range modes() {
		t.Run(mode.String(), func(t *testing.T) {
			g := openGateway(t, conn, mode)
			g.extra = append(g.extra, header(picker.KVSourceHeader, "203.0.113.9:5710"))
			if _, refused := g.sendRequest([]byte(chatBody("src", "Pull from my host. ", fmtInt(i))), nil); refused != nil {
				t.Fatalf("refused: %v", refused)
			}
			g.end()
			if _, set := g.set[picker.KVSourceHeader]; set || !slices.Contains(g.removed, picker.KVSourceHeader) {
				t.Fatalf("set %v, removed %v: want %s removed, not set", g.set, g.removed, picker.KVSourceHeader)
			}
		})
	}
}

// TestEPPStreamedWaitingAsksForBuffered: in STREAMED mode a gateway that
// waits for the headers' answer gets a mode override to BUFFERED, and the
// buffered body's answer routes.
func TestEPPStreamedWaitingAsksForBuffered(t *testing.T) {
	f := startFleet(t, 2, picker.DefaultConfig(), "")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	g := openGateway(t, conn, filterv3.ProcessingMode_STREAMED)
	h := g.requestHeaders(false, nil)
	h.ProtocolConfig.SendBodyWithoutWaitingForHeaderResponse = false
	g.send(h)
	m := g.recv()
	if m.GetRequestHeaders() == nil || m.GetModeOverride().GetRequestBodyMode() != filterv3.ProcessingMode_BUFFERED {
		t.Fatalf("want a mode override to BUFFERED, got %v", m)
	}
	g.send(requestBody([]byte(chatBody("s", "hello")), true))
	b := g.recv()
	if b.GetRequestBody() == nil {
		t.Fatalf("want the body's answer, got %v", b)
	}
	if route := routeOf(t, b, b.GetRequestBody().GetResponse()); len(strings.Split(route, ",")) != 2 {
		t.Fatalf("route %q", route)
	}
}

// TestEPPConversationLandsWarm: a conversation's second turn, through the
// endpoint picker, is sent where its first was served — a cache hit the
// engine confirms and the outcome metrics count as predicted. The first
// turn streams (SSE) back through the stream.
func TestEPPConversationLandsWarm(t *testing.T) {
	f := startFleet(t, 3, picker.DefaultConfig(), "")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	first := chatBody("warm", strings.Repeat("Tell me about caches. ", 30))
	stream := strings.Replace(first, `"max_tokens":8`, `"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}`, 1)
	g := openGateway(t, conn, mode)
	route, _ := g.sendRequest([]byte(stream), nil)
	warm := strings.Split(route, ",")[0]
	resp, raw := forward(t, warm, stream)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("turn 1: %d %s", resp.StatusCode, raw)
	}
	g.sendResponse(warm, resp, raw)
	if n := gauge(t, f.reg, "kvroute_picker_outcomes_total", "outcome", "no_usage"); n != 0 {
		t.Fatal("the streamed answer's usage was not found")
	}
	f.awaitHeld(t, "http://"+warm, first)
	f.awaitLoadReports(t)

	second := chatBody("warm", strings.Repeat("Tell me about caches. ", 30), "Caches keep things.", "And KV caches?")
	hash := g.set["x-kvroute-prefix-hash"]
	if _, a, _ := f.pick(t, stream, nil, ""); len(hash) != 16 || hash != a.PrefixHash {
		t.Fatalf("turn 1's prefix hash %q, the decision API's %q", hash, a.PrefixHash)
	}
	g = openGateway(t, conn, mode)
	route, _ = g.sendRequest([]byte(second), nil)
	if got := strings.Split(route, ",")[0]; got != warm {
		t.Fatalf("turn 2 went to %s, turn 1 was served by %s", got, warm)
	}
	if g.set["x-kvroute-prefix-hash"] != hash || g.set["x-kvroute-matched-tokens"] == "0" || g.set["x-kvroute-matched-tokens"] == "" {
		t.Fatalf("turn 2's decision headers %v: want turn 1's prefix hash %s and matched tokens", g.set, hash)
	}
	if ms, err := strconv.ParseFloat(g.set["x-kvroute-predicted-ttft-ms"], 64); err != nil || !(ms > 0) {
		t.Fatalf("turn 2's decision headers %v: want x-kvroute-predicted-ttft-ms, the prediction", g.set)
	}
	resp, raw = forward(t, warm, second)
	if u := openai.UsageOf(raw); resp.StatusCode != 200 || u.Cached == 0 {
		t.Fatalf("turn 2: %d, %d cached tokens: %s", resp.StatusCode, u.Cached, raw)
	}
	g.sendResponse(warm, resp, raw)
	if n := gauge(t, f.reg, "kvroute_picker_decisions_total", "reason", "cache_hit"); n != 2 { // turn 2's, and the decision API's for turn 1 after it ran
		t.Fatalf("cache-hit decisions: %v", n)
	}
	if n := gauge(t, f.reg, "kvroute_picker_outcomes_total", "outcome", "as_predicted"); n != 2 {
		t.Fatalf("as_predicted outcomes: %v (the cold first turn and the warm second)", n)
	}
	if p := counter(t, f.reg, "kvroute_picker_predicted_cached_tokens_total"); p == 0 {
		t.Fatal("nothing predicted for the warm turn")
	}
}

// TestEPPCacheOff: X-KVRoute-Cache: off leaves the prefix hash out of the
// routing answer, as on the HTTP path; without it the hash is there.
func TestEPPCacheOff(t *testing.T) {
	f := startFleet(t, 1, picker.DefaultConfig(), "")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	body := []byte(chatBody("off", strings.Repeat("An anchored question. ", 20)))
	for _, off := range []bool{false, true} {
		g := openGateway(t, conn, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
		if off {
			g.extra = append(g.extra, header("X-KVRoute-Cache", "off"))
		}
		g.sendRequest(body, nil)
		g.end()
		if _, has := g.set["x-kvroute-prefix-hash"]; has == off || g.set["x-kvroute-matched-tokens"] == "" {
			t.Fatalf("cache off %v: headers %v", off, g.set)
		}
	}
}

// TestEPPSubsetHint: the picker picks only from the gateway's subset (a
// list, a comma-separated string, a bare IP naming every port of a pod),
// and answers 503 when it names no endpoint here (an empty list too).
func TestEPPSubsetHint(t *testing.T) {
	f := startFleet(t, 3, picker.DefaultConfig(), "")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	addrs := engineAddrs(f)
	mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	body := []byte(chatBody("subset", "Which endpoint?"))
	for _, tc := range []struct {
		name   string
		subset any
		want   []string // the route's entries, as a set
	}{
		{name: "one endpoint", subset: []string{addrs[1]}, want: []string{addrs[1]}},
		{name: "two, as a comma-separated string", subset: addrs[0] + ", " + addrs[2], want: []string{addrs[0], addrs[2]}},
		{name: "a bare IP: every port", subset: []string{"127.0.0.1"}, want: addrs},
	} {
		g := openGateway(t, conn, mode)
		route, refused := g.sendRequest(body, tc.subset)
		if refused != nil {
			t.Fatalf("%s: refused %v", tc.name, refused)
		}
		got := strings.Split(route, ",")
		if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(tc.want))) {
			t.Fatalf("%s: route %q, want %v", tc.name, route, tc.want)
		}
	}
	for _, subset := range []any{[]string{"10.9.9.9:8000"}, []string{}, "", []string{strings.Split(addrs[0], ":")[0] + ":1"}} {
		g := openGateway(t, conn, mode)
		_, refused := g.sendRequest(body, subset)
		if refused == nil {
			t.Fatalf("subset %q: not refused", subset)
		}
		if code, ecode := immediate(t, refused); code != 503 || ecode != "no_endpoint_in_subset" {
			t.Fatalf("subset %q: %d %s", subset, code, ecode)
		}
		g.end()
	}
	if n := gauge(t, f.reg, "kvroute_picker_extproc_requests_total", "result", "subset_empty"); n != 4 {
		t.Fatalf("subset_empty: %v", n)
	}
}

// TestEPPRefusals: no ready endpoint is a 503, an unknown model a 404, a
// body that is not a request a 400, one past --max-body-bytes a 413: each
// an immediate response with an OpenAI error body, counted, the stream
// ended cleanly.
func TestEPPRefusals(t *testing.T) {
	empty := emptyView(t)
	reg := prometheus.NewRegistry()
	none, err := picker.NewRouter(picker.DefaultConfig(), empty, zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(none.Close)
	mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	for _, eos := range []bool{false, true} { // with a body, and without (a GET)
		g := openGateway(t, serveEPP(t, none, extproc.DefaultConfig()), mode)
		g.send(g.requestHeaders(eos, nil))
		if !eos {
			g.send(requestBody([]byte(chatBody("x", "hi")), true))
		}
		if code, ecode := immediate(t, g.recv()); code != 503 || ecode != "no_healthy_endpoint" {
			t.Fatalf("no endpoints (bodiless %v): %d %s", eos, code, ecode)
		}
		g.end()
	}
	if n := gauge(t, reg, "kvroute_picker_extproc_requests_total", "result", "no_endpoint"); n != 2 {
		t.Fatalf("no_endpoint: %v", n)
	}

	cfg := picker.DefaultConfig()
	cfg.MaxBodyBytes = 4096
	f := startFleet(t, 1, cfg, "")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"unknown model", strings.Replace(chatBody("x", "hi"), "Qwen/Qwen3-0.6B", "no-such-model", 1), 404, "model_not_found"},
		{"not a request", `{"model":`, 400, ""},
		{"too large", chatBody("x", strings.Repeat("big ", 2000)), 413, "request_too_large"},
	} {
		g := openGateway(t, conn, mode)
		_, refused := g.sendRequest([]byte(tc.body), nil)
		if refused == nil {
			t.Fatalf("%s: not refused", tc.name)
		}
		if code, ecode := immediate(t, refused); code != tc.status || tc.code != "" && ecode != tc.code {
			t.Fatalf("%s: %d %s, want %d %s", tc.name, code, ecode, tc.status, tc.code)
		}
		g.end()
	}
	if n := gauge(t, f.reg, "kvroute_picker_extproc_requests_total", "result", "refused"); n != 3 {
		t.Fatalf("refused: %v", n)
	}
}

// emptyView is a fleet view that knows no endpoint.
func emptyView(t *testing.T) *fleetview.View {
	vcfg := fleetview.DefaultConfig()
	vcfg.Params = summary.ForCapacity(capacity)
	v, err := fleetview.New(vcfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	return v
}

// TestEPPBodilessRequest: a request without a body (a GET) goes to the
// least loaded endpoint, with fallbacks, routed on the headers' answer.
func TestEPPBodilessRequest(t *testing.T) {
	f := startFleet(t, 2, picker.DefaultConfig(), "")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	g := openGateway(t, conn, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	g.send(g.requestHeaders(true, nil))
	m := g.recv()
	if m.GetRequestHeaders() == nil {
		t.Fatalf("want the headers' answer, got %v", m)
	}
	if route := routeOf(t, m, m.GetRequestHeaders().GetResponse()); len(strings.Split(route, ",")) != 2 {
		t.Fatalf("route %q", route)
	}
}

// TestEPPShedsWhenSaturated: with --ext-proc-shed-waiting 1, a request
// is refused with 429 once every endpoint has a request waiting (the
// engines run one at a time); with shedding off (the default), the same
// fleet still gets a destination.
// keepBusy sends each engine of f two long requests, directly, until the
// test ends, and waits until every sidecar reports one waiting (the
// engines run one request at a time).
func keepBusy(t *testing.T, f *fleet) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	long := `{"model":"Qwen/Qwen3-0.6B","prompt":"Keep going.","max_tokens":2000,"ignore_eos":true}`
	for _, e := range f.engines {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", strings.NewReader(long))
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
	}
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !everyEndpointWaiting(f) {
			return errors.New("the engines' sidecars report no waiting request yet")
		}
		return nil
	})
}

// retryAfter is an immediate response's Retry-After header.
func retryAfter(m *extprocv3.ProcessingResponse) string {
	for _, h := range m.GetImmediateResponse().GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

// TestEPPAdmission: the endpoint picker passes admission as the proxy
// does: with every endpoint saturated (one waiting, at
// --saturation-waiting 1) and no queue room, the gateway gets 429
// queue_full with Retry-After, counted by the request's tenant; a bad
// priority header is a 400.
func TestEPPAdmission(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.Admission.MaxWaiting, cfg.Admission.QueueSize = 1, 0
	f := startFleetWith(t, 2, cfg, "", func(c *enginesim.Config) {
		c.MaxNumSeqs, c.Sim.TimeScale = 1, 1
	})
	srv := serveEPP(t, f.router, extproc.DefaultConfig())
	keepBusy(t, f)
	g := openGateway(t, srv, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	g.extra = []*corev3.HeaderValue{header("x-kvroute-tenant", "acme")}
	_, refused := g.sendRequest([]byte(chatBody("adm", "Room?")), nil)
	if refused == nil {
		t.Fatal("admitted to a saturated fleet with no queue")
	}
	if code, ecode := immediate(t, refused); code != 429 || ecode != "queue_full" || retryAfter(refused) == "" {
		t.Fatalf("%d %s, Retry-After %q", code, ecode, retryAfter(refused))
	}
	g.end()
	if n := gauge(t, f.reg, "kvroute_picker_admission_total", "fairness_key", "tenant:acme"); n != 1 {
		t.Fatalf("admission_total{tenant:acme} = %v", n)
	}
	g = openGateway(t, srv, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	g.extra = []*corev3.HeaderValue{header("x-kvroute-priority", "soon")}
	_, refused = g.sendRequest([]byte(chatBody("adm", "Room?")), nil)
	if code, ecode := immediate(t, refused); code != 400 || ecode != "invalid_priority" {
		t.Fatalf("bad priority: %d %s", code, ecode)
	}
	g.end()
}

func TestEPPShedsWhenSaturated(t *testing.T) {
	f := startFleetWith(t, 2, picker.DefaultConfig(), "", func(c *enginesim.Config) {
		c.MaxNumSeqs, c.Sim.TimeScale = 1, 1 // one request at a time, in real time: the next waits
	})
	shed := extproc.DefaultConfig()
	shed.ShedWaiting = 1
	shedding, open := serveEPP(t, f.router, shed), serveEPP(t, f.router, extproc.DefaultConfig())
	keepBusy(t, f)
	body := []byte(chatBody("shed", "Are you busy?"))
	g := openGateway(t, shedding, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	_, refused := g.sendRequest(body, nil)
	if refused == nil {
		t.Fatal("not shed")
	}
	if code, ecode := immediate(t, refused); code != 429 || ecode != "overloaded" || retryAfter(refused) == "" {
		t.Fatalf("%d %s, Retry-After %q", code, ecode, retryAfter(refused))
	}
	g.end()
	if n := gauge(t, f.reg, "kvroute_picker_extproc_requests_total", "result", "shed"); n != 1 {
		t.Fatalf("shed: %v", n)
	}
	if n := gauge(t, f.reg, "kvroute_picker_refused_total", "reason", "shed"); n != 1 {
		t.Fatalf("refused{shed}: %v", n)
	}
	g = openGateway(t, open, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if route, refused := g.sendRequest(body, nil); refused != nil || route == "" {
		t.Fatalf("with shedding off: %q %v", route, refused)
	}
}

func everyEndpointWaiting(f *fleet) bool {
	for _, e := range f.view.Endpoints() {
		if e.Load.Waiting < 1 {
			return false
		}
	}
	return true
}

// TestEPPServedByFallback: when the gateway reports a fallback served the
// request, the pick moves to it (its in-flight gauge, its prediction) and
// is counted as served by a fallback.
func TestEPPServedByFallback(t *testing.T) {
	f := startFleet(t, 3, picker.DefaultConfig(), "")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	g := openGateway(t, conn, filterv3.ProcessingMode_BUFFERED)
	body := chatBody("fallback", "Who serves this?")
	route, _ := g.sendRequest([]byte(body), nil)
	list := strings.Split(route, ",")
	resp, raw := forward(t, list[1], body)
	before := counter(t, f.reg, "kvroute_picker_outcomes_total")
	g.sendResponse(list[1], resp, raw)
	if n := gauge(t, f.reg, "kvroute_picker_extproc_served_total", "as", "fallback"); n != 1 {
		t.Fatalf("served by a fallback: %v", n)
	}
	if n := counter(t, f.reg, "kvroute_picker_outcomes_total"); n != before+1 {
		t.Fatal("the fallback's answer was not accounted")
	}
	for _, e := range f.view.Endpoints() {
		if e.URL == "http://"+list[0] && !e.Ejected {
			t.Fatalf("the endpoint that failed before the fallback (%s) was not reported", list[0])
		}
	}
}

// TestEPPProtocolErrors: a body before the headers ends the stream with
// INVALID_ARGUMENT; a body that does not come whole within the body
// timeout with DEADLINE_EXCEEDED; both counted as errors.
func TestEPPProtocolErrors(t *testing.T) {
	f := startFleet(t, 1, picker.DefaultConfig(), "")
	cfg := extproc.DefaultConfig()
	cfg.BodyTimeout = 200 * time.Millisecond
	conn := serveEPP(t, f.router, cfg)
	g := openGateway(t, conn, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	g.send(requestBody([]byte("{}"), true))
	if _, err := g.stream.Recv(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "before the request headers") {
		t.Fatalf("body before headers: %v", err)
	}
	g = openGateway(t, conn, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	g.send(g.requestHeaders(false, nil))
	g.send(requestBody([]byte(`{"model":`), false))
	if _, err := g.stream.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a body that never ends: %v", err)
	}
	if n := gauge(t, f.reg, "kvroute_picker_extproc_requests_total", "result", "error"); n != 2 {
		t.Fatalf("errors: %v", n)
	}
}

// TestEPPHealth: liveness is SERVING while the process answers;
// readiness and the ext_proc service follow whether an endpoint is
// routable; an unknown service is NOT_FOUND.
func TestEPPHealth(t *testing.T) {
	f := startFleet(t, 1, picker.DefaultConfig(), "")
	check := func(conn *grpc.ClientConn, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		return r.GetStatus(), err
	}
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	for _, s := range []string{"liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""} {
		if st, err := check(conn, s); err != nil || st != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%q: %v %v", s, st, err)
		}
	}
	if _, err := check(conn, "nope"); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown service: %v", err)
	}
	none, err := picker.NewRouter(picker.DefaultConfig(), emptyView(t), zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(none.Close)
	conn = serveEPP(t, none, extproc.DefaultConfig())
	if st, err := check(conn, "liveness"); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness without endpoints: %v %v", st, err)
	}
	for _, s := range []string{"readiness", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		if st, err := check(conn, s); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%q without endpoints: %v %v", s, st, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch: %v %v", r, err)
	}
}

// TestEPPUnknownMessage: a message carrying none of the request kinds is
// refused with a clear error, not a panic.
func TestEPPUnknownMessage(t *testing.T) {
	f := startFleet(t, 1, picker.DefaultConfig(), "")
	g := openGateway(t, serveEPP(t, f.router, extproc.DefaultConfig()), filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	g.send(&extprocv3.ProcessingRequest{})
	if _, err := g.stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%v", err)
	}
}

// TestEPPServerTLS: picker.Start serves the endpoint picker on
// --ext-proc-listen with TLS from --ext-proc-tls-cert/--ext-proc-tls-key:
// a client trusting the certificate gets a destination and health; a
// plaintext client does not get through.
func TestEPPServerTLS(t *testing.T) {
	certFile, keyFile, pool := testnet.SelfSigned(t)
	pod := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond})
	cfg := picker.DefaultServerConfig()
	cfg.AdminListen = "127.0.0.1:0"
	cfg.Listen, cfg.GRPCListen, cfg.ExtProcListen = "127.0.0.1:0", "", "127.0.0.1:0"
	cfg.Sidecars, cfg.Capacity = []string{pod.Sidecar.GRPCAddr()}, capacity
	cfg.ExtProcTLSCert, cfg.ExtProcTLSKey = certFile, keyFile
	s, err := picker.Start(context.Background(), cfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	conn, err := grpc.NewClient(s.ExtProcAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		if err == nil && r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = fmt.Errorf("readiness %v over TLS", r.GetStatus())
		}
		return err
	})
	g := openGateway(t, conn, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if route, refused := g.sendRequest([]byte(chatBody("tls", "hello")), nil); refused != nil || route != strings.TrimPrefix(pod.Engine.URL(), "http://") {
		t.Fatalf("route %q, refused %v", route, refused)
	}
	plain, err := grpc.NewClient(s.ExtProcAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{Service: "liveness"}); err == nil {
		t.Fatal("a plaintext client was answered by the TLS endpoint picker")
	}
}
