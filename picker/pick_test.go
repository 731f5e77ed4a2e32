package picker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker"
	fleetpkg "github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/localfleet"
	"github.com/kvroute/kvroute/picker/pickapi"
	"github.com/kvroute/kvroute/picker/render"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/enginesim"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

const capacity = 4096

type fleet struct {
	engines []*enginesim.Engine
	procs   []*enginesim.Process    // by engine (a process's ranks share it)
	view    picker.Fleet            // a fleetview.View (startPods), or the in-process fleet (startLocalWith)
	local   *localfleet.Fleet       // the in-process fleet, when there is one
	down    map[string]*atomic.Bool // in-process: the engines the test stopped (kill), reported down
	router  *picker.Router
	reg     *prometheus.Registry
	api     *httptest.Server // the public API
	admin   *httptest.Server // the admin surface
}

// startFleet starts n engines feeding an in-process fleet, and a router
// over it with its HTTP API (startLocalWith): no sidecar, no stream.
// Tests of the sockets, gossip and streams between sidecars and the
// picker use startPods.
func startFleet(t *testing.T, n int, cfg picker.Config, token string) *fleet {
	t.Helper()
	return startLocalWith(t, n, cfg, token, nil)
}

// startFleetWith is startFleet with each engine's configuration adjusted.
func startFleetWith(t testing.TB, n int, cfg picker.Config, token string, adjust func(*enginesim.Config)) *fleet {
	t.Helper()
	return startLocalWith(t, n, cfg, token, adjust)
}

// startPods starts n real pods — an engine publishing its KV events on
// ZMQ and a sidecar streaming summaries over gRPC — a fleet view
// following them, and a router with its HTTP API: for the tests of what
// only the real pipeline shows.
func startPods(t testing.TB, n int, cfg picker.Config, token string, adjust func(*enginesim.Config)) *fleet {
	t.Helper()
	f := &fleet{}
	vcfg := fleetview.DefaultConfig()
	vcfg.Params, vcfg.Retry = summary.ForCapacity(capacity), 50*time.Millisecond
	v, err := fleetview.New(vcfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	f.view = v
	for i := 0; i < n; i++ {
		p := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond, Engine: adjust})
		v.Watch(p.Sidecar.GRPCAddr())
		f.engines = append(f.engines, p.Engine)
		f.procs = append(f.procs, p.Process)
	}
	t.Cleanup(v.Close) // before the pods' (cleanups run last first): no sidecar closes with a stream open
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := len(v.Endpoints()); got < n || !loaded(v) {
			return fmt.Errorf("the view knows %d of %d endpoints, loaded: %v", got, n, loaded(v))
		}
		return nil
	})
	f.serve(t, cfg, token)
	return f
}

// serve makes the router over the fleet and serves its public API and
// admin surface until the test ends.
func (f *fleet) serve(t testing.TB, cfg picker.Config, token string) {
	t.Helper()
	f.reg = prometheus.NewRegistry()
	r, err := picker.NewRouter(cfg, f.view, zap.NewNop(), f.reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	f.router = r
	f.api = httptest.NewServer(r.Handler(picker.HandlerOptions{DecisionToken: token}))
	t.Cleanup(f.api.Close)
	f.admin = httptest.NewServer(r.AdminHandler(picker.HandlerOptions{}))
	t.Cleanup(f.admin.Close)
}

func loaded(v picker.Fleet) bool {
	for _, e := range v.Endpoints() {
		if !e.HasLoad() {
			return false
		}
	}
	return true
}

// awaitLoadReports waits (bounded) until every endpoint has a load report
// that arrived after this call: the picks made before it are covered.
func (f *fleet) awaitLoadReports(t testing.TB) {
	t.Helper()
	since := time.Now()
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		for _, e := range f.view.Endpoints() {
			if !e.LoadAt.After(since) {
				return fmt.Errorf("no new load report from %s", e.URL)
			}
		}
		return nil
	})
}

// awaitHeld waits (bounded) until the view holds the whole prompt of a
// chat body, as the engine at url renders it, on that endpoint.
func (f *fleet) awaitHeld(t *testing.T, url, body string) {
	t.Helper()
	rc := render.New(5*time.Second, 16<<20)
	defer rc.Close()
	r, err := rc.Render(context.Background(), url, intake.Chat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var salt struct {
		CacheSalt string `json:"cache_salt"`
	}
	_ = json.Unmarshal([]byte(body), &salt)
	var e *fleetpkg.Endpoint
	for _, x := range f.view.Endpoints() {
		if x.URL == url {
			e = &x
		}
	}
	if e == nil {
		t.Fatalf("the view does not know %s", url)
	}
	chain := (&blockkey.Request{Tokens: r.TokenIDs, CacheSalt: salt.CacheSalt}).AppendKeys(nil, e.Info.Model, e.Info.BlockSize)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := f.view.Match(e.Group, tier.GPU, chain)[url]; got < len(chain) {
			return fmt.Errorf("the view holds %d of the prompt's %d blocks on %s", got, len(chain), url)
		}
		return nil
	})
}

// pickAnswer is the decision API's answer, as clients decode it.
type pickAnswer = pickapi.Answer

func (f *fleet) pick(t *testing.T, body string, header http.Header, query string) (int, pickAnswer, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.api.URL+"/routing/v1/pick"+query, strings.NewReader(body))
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var a pickAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &a); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
	}
	return resp.StatusCode, a, raw
}

// grpcClient serves the router's gRPC decision API (token: the bearer
// token it wants, "" none) on a free port until the test ends, and
// returns a client of it.
func (f *fleet) grpcClient(t *testing.T, token string) pb.PickerClient {
	t.Helper()
	srv := grpc.NewServer()
	f.router.RegisterGRPC(srv, token)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewPickerClient(conn)
}

// kill stops the engine at url (its sidecar lives on, and reports it
// down; in-process, the load reporter does).
func (f *fleet) kill(t *testing.T, url string) {
	for i, e := range f.engines {
		if e.URL() == url {
			f.procs[i].Close()
			if d := f.down[url]; d != nil {
				d.Store(true)
			}
			return
		}
	}
	t.Fatalf("no engine %s", url)
}

// send runs a request on an engine and returns its cached prompt tokens.
func send(t *testing.T, url, path, body string) int {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", path, resp.StatusCode, raw)
	}
	return openai.UsageOf(raw).Cached
}

func chatBody(salt string, turns ...string) string {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You are a careful assistant with tools. ", 40)}}
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": t})
	}
	b, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "messages": msgs, "cache_salt": salt, "max_tokens": 8})
	return string(b)
}

// TestDecisionAPI: a conversation's second turn is sent where its first
// ran, with the first turn's prefix hash; another tenant's identical
// conversation gets its own hash and is not drawn to the warm endpoint.
func TestDecisionAPI(t *testing.T) {
	f := startFleet(t, 3, picker.DefaultConfig(), "")
	first := chatBody("tenant-a", strings.Repeat("Tell me about caches. ", 30))
	code, p1, raw := f.pick(t, first, nil, "")
	if code != http.StatusOK || p1.Reason != "cold_anchor" || len(p1.PrefixHash) != 16 || p1.PromptTokens == 0 || p1.EndpointID == "" {
		t.Fatalf("turn 1: %d %s", code, raw)
	}
	send(t, p1.Endpoint, "/v1/chat/completions", first)
	second := chatBody("tenant-a", strings.Repeat("Tell me about caches. ", 30), "Caches keep things.", "And KV caches?")
	var p2 pickAnswer
	// Every pick counts as in flight on its endpoint until the engine's
	// next load report (every 50 ms here): poll slower than that, or the
	// polls themselves load the warm endpoint.
	testnet.Await(t, 10*time.Second, 150*time.Millisecond, func() error {
		code, p2, raw = f.pick(t, second, nil, "?explain=true")
		if code != http.StatusOK {
			t.Fatalf("turn 2: %d %s", code, raw)
		}
		if p2.Reason != "cache_hit" {
			return fmt.Errorf("turn 2 is %s on %s, not a cache hit", p2.Reason, p2.Endpoint)
		}
		return nil
	})
	if p2.Endpoint != p1.Endpoint || p2.Reason != "cache_hit" || p2.MatchedTokens < p1.PromptTokens/2 || p2.PrefixHash != p1.PrefixHash {
		t.Fatalf("turn 2 went to %s (%s, %d matched of turn 1's %d, hash %s vs %s) %s", p2.Endpoint, p2.Reason, p2.MatchedTokens, p1.PromptTokens, p2.PrefixHash, p1.PrefixHash, raw)
	}
	if len(p2.Candidates) != 3 {
		t.Fatalf("explain gave %d candidates", len(p2.Candidates))
	}
	if cached := send(t, p2.Endpoint, "/v1/chat/completions", second); cached < p2.MatchedTokens {
		t.Fatalf("engine cached %d tokens, the picker predicted %d", cached, p2.MatchedTokens)
	}
	// Opting out of the cache hash (after the picks above are covered by
	// a load report).
	f.awaitLoadReports(t)
	_, po, rawOff := f.pick(t, second, http.Header{"X-Kvroute-Cache": {"off"}}, "?explain=true")
	if po.PrefixHash != "" || po.Endpoint != p1.Endpoint {
		t.Fatalf("cache off: %s", rawOff)
	}
	// Explained decisions list the request's block keys, canonical.
	if len(po.Keys) != po.PromptTokens/16 || len(po.Keys) == 0 {
		t.Fatalf("%d keys for %d tokens", len(po.Keys), po.PromptTokens)
	}
	for _, k := range po.Keys {
		if pk, err := blockkey.ParseKey(k); err != nil || pk.String() != k {
			t.Fatalf("key %q: %v", k, err)
		}
	}
	// Another tenant, same words: its own hash, no match anywhere.
	_, pb, _ := f.pick(t, chatBody("tenant-b", strings.Repeat("Tell me about caches. ", 30), "Caches keep things.", "And KV caches?"), nil, "")
	if pb.PrefixHash == p1.PrefixHash || pb.MatchedTokens != 0 || pb.Reason != "cold_anchor" {
		t.Fatalf("tenant b: %+v", pb)
	}
	// A request whose anchor holds no full block has no prefix hash.
	_, short, _ := f.pick(t, `{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"hi"}]}`, nil, "")
	if short.PrefixHash != "" || short.Endpoint == "" {
		t.Fatalf("a short request: %+v", short)
	}
	// Health, readiness and the endpoints' debug view, on the admin port.
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ok", "/debug/endpoints": p1.Endpoint} {
		resp, err := http.Get(f.admin.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		if path == "/debug/endpoints" && (!strings.Contains(string(b), `"key_format":"`+blockkey.FormatV1+`"`) || !strings.Contains(string(b), `"summary_params":"`)) {
			t.Fatalf("the endpoints' identity is not shown: %s", b)
		}
	}
	// Token-id bodies skip rendering and carry their own anchor.
	ids := make([]int, 300)
	for i := range ids {
		ids[i] = 1000 + i
	}
	tb, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "token_ids": ids, "cache_salt": "t"})
	code, pt, raw := f.pick(t, string(tb), nil, "")
	if code != http.StatusOK || pt.PromptTokens != 300 || pt.PrefixHash == "" {
		t.Fatalf("token body: %d %s", code, raw)
	}
}

// TestDecisionAPIRefusals: each refusal comes with its status and an
// OpenAI-style error body.
func TestDecisionAPIRefusals(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.MaxBodyBytes = 4096
	f := startFleet(t, 1, cfg, "secret")
	auth := http.Header{"Authorization": {"Bearer secret"}}
	for _, tc := range []struct {
		name   string
		body   string
		header http.Header
		status int
		code   string
	}{
		{"no token", chatBody("s", "hi"), nil, 401, "invalid_api_key"},
		{"wrong token", chatBody("s", "hi"), http.Header{"Authorization": {"Bearer nope"}}, 401, "invalid_api_key"},
		{"malformed", `{"messages": [`, auth, 400, ""},
		{"no model", `{"messages":[{"role":"user","content":"x"}]}`, auth, 400, ""},
		{"unknown model", `{"model":"gpt-nothing","messages":[{"role":"user","content":"x"}]}`, auth, 404, "model_not_found"},
		{"previous response", `{"model":"Qwen/Qwen3-0.6B","input":"more","previous_response_id":"resp_1"}`, auth, 400, "unresolved_previous_response"},
		{"mixed batch", `{"model":"Qwen/Qwen3-0.6B","prompt":["a",[1,2]]}`, auth, 400, ""},
		{"unknown lora", `{"model":"Qwen/Qwen3-0.6B","token_ids":[1,2,3],"lora":"no-such-adapter"}`, auth, 404, "model_not_found"},
		{"too large", `{"model":"Qwen/Qwen3-0.6B","prompt":"` + strings.Repeat("x", 5000) + `"}`, auth, 413, ""},
	} {
		code, _, raw := f.pick(t, tc.body, tc.header, "")
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(raw, &e); code != tc.status || err != nil || e.Error.Message == "" ||
			(tc.code != "" && (e.Error.Code == nil || *e.Error.Code != tc.code)) {
			t.Errorf("%s: %d %s", tc.name, code, raw)
		}
	}
}

// TestGRPCPickAgreesWithHTTP: gRPC kvroute.v1.Picker/Pick answers what the
// HTTP decision API answers, and wants the same bearer token. The first
// pick counts in flight on its endpoint until a load report covers it
// (its tokens wait there), so the same cold request asked again may be
// predicted faster on the other endpoint: the endpoints may differ, the
// rest of the answer may not.
func TestGRPCPickAgreesWithHTTP(t *testing.T) {
	f := startFleet(t, 2, picker.DefaultConfig(), "tok")
	client := f.grpcClient(t, "tok")
	body := chatBody("g", strings.Repeat("A question that is long enough to fill blocks. ", 20))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer tok")
	got, err := client.Pick(ctx, &pb.PickRequest{Body: []byte(body), Explain: true})
	if err != nil {
		t.Fatal(err)
	}
	code, want, raw := f.pick(t, body, http.Header{"Authorization": {"Bearer tok"}}, "")
	if code != 200 || got.PrefixHash != want.PrefixHash || got.PromptTokens != int32(want.PromptTokens) || got.Policy != want.Policy ||
		got.Reason != want.Reason || len(got.Candidates) != 2 || !(got.PredictedTtftMs > 0) || !(want.PredictedTTFTMs > 0) {
		t.Fatalf("gRPC %+v, HTTP %s", got, raw)
	}
	// No endpoint runs a P2P tier: no KV source, said alike (the HTTP
	// answer always carries the two fields).
	if got.KvSource != "" || got.KvSourceTokens != 0 || want.KVSource != "" || !strings.Contains(string(raw), `"kv_source":"","kv_source_tokens":0`) {
		t.Fatalf("KV source: gRPC %q %d, HTTP %s", got.KvSource, got.KvSourceTokens, raw)
	}
	if _, err := client.Pick(context.Background(), &pb.PickRequest{Body: []byte(body)}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	_, err = client.Pick(ctx, &pb.PickRequest{Body: []byte(`{"model":"Qwen/Qwen3-0.6B","input":"x","previous_response_id":"r"}`)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "unresolved_previous_response") {
		t.Fatalf("previous_response_id: %v", err)
	}
}

// TestTokenizeTimeoutFallsBack: a render that does not answer in time
// leaves the request placed by consistent hashing on its raw anchor —
// the same endpoint for the same anchor — and counted.
func TestTokenizeTimeoutFallsBack(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.TokenizeTimeout = time.Nanosecond // every render is late
	f := startFleet(t, 3, cfg, "")
	var first string
	for i := 0; i < 3; i++ {
		code, p, raw := f.pick(t, chatBody("s", "Same conversation start."), nil, "")
		if code != 200 || p.Reason != "prefix_hash" || p.Policy != "prefix-hash" || p.PrefixHash != "" {
			t.Fatalf("%d %s", code, raw)
		}
		if i == 0 {
			first = p.Endpoint
		} else if p.Endpoint != first {
			t.Fatalf("the fallback moved the anchor from %s to %s", first, p.Endpoint)
		}
	}
	if n := counter(t, f.reg, "kvroute_picker_fallbacks_total"); n < 3 {
		t.Fatalf("%v fallbacks counted", n)
	}
}

// TestLoRAKeys: a request naming a LoRA adapter (resolved through the
// engines' model list) is keyed under the adapter, so its second turn
// finds the first; the base model with the same words finds nothing.
func TestLoRAKeys(t *testing.T) {
	f := startFleetWith(t, 2, picker.DefaultConfig(), "", func(c *enginesim.Config) {
		c.EnableLoRA = true
		c.LoRAModules = []enginesim.LoRAModule{{Name: "support-adapter", Path: "/adapters/support"}}
	})
	body := func(model string) string {
		b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "messages": []map[string]string{
			{"role": "system", "content": strings.Repeat("Adapter-specific instructions. ", 40)}, {"role": "user", "content": "Hello there."}}})
		return string(b)
	}
	code, p1, raw := f.pick(t, body("support-adapter"), nil, "")
	if code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	send(t, p1.Endpoint, "/v1/chat/completions", body("support-adapter"))
	testnet.Await(t, 10*time.Second, 150*time.Millisecond, func() error {
		if _, p2, _ := f.pick(t, body("support-adapter"), nil, ""); p2.Reason != "cache_hit" || p2.Endpoint != p1.Endpoint || p2.MatchedTokens == 0 {
			return fmt.Errorf("the adapter's blocks never matched: %+v", p2)
		}
		return nil
	})
	_, base, _ := f.pick(t, body("Qwen/Qwen3-0.6B"), nil, "")
	if base.MatchedTokens != 0 || base.PrefixHash == p1.PrefixHash {
		t.Fatalf("the base model matched the adapter's blocks: %+v", base)
	}
}
