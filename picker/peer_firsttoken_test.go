package picker_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	fleetpkg "github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/localfleet"
	"github.com/kvroute/kvroute/picker/peers"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/enginesim"
)

// TestPeerFirstChunkAndFirstToken: the proxy gives each peer the signal
// its system uses. On a /v1/responses stream Dynamo's A_w stays booked
// through response.created and response.in_progress (and the
// output_item/content_part openers) and ends at the first output delta;
// llm-d's inflight-load producer releases its tokens at the first chunk,
// response.created, as upstream does. On a chat stream the first chunk is
// the first output, so Dynamo's A_w ends there. A gate between the picker
// and the engine holds the answer at each point while the client checks:
// the proxy calls the hooks before it writes a chunk to the client, so a
// chunk read is a chunk booked.
func TestPeerFirstChunkAndFirstToken(t *testing.T) {
	cases := []struct {
		name   string
		policy score.Policy
		path   string
		// load is the peer's booked prefill on the endpoint.
		load func(p peers.Policy, endpoint string) int
		// wantOpened: booked after the opening events (created,
		// in_progress); wantDelta: after the first output.
		wantOpened, wantDelta bool
	}{
		{"dynamo responses: A_w to the first delta", score.Dynamo, "/v1/responses", dynamoA, true, false},
		{"llm-d responses: tokens to the first chunk", score.LLMD, "/v1/responses", llmdTokens, false, false},
		{"dynamo chat: A_w to the first chunk", score.Dynamo, "/v1/chat/completions", dynamoA, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := picker.DefaultConfig()
			cfg.Score.Policy = tc.policy
			f, g := startGated(t, cfg)
			booked := func() int {
				var n int
				f.router.WithPeerPolicy(func(p peers.Policy) { n = tc.load(p, g.url) })
				return n
			}
			answer := make(chan *http.Response, 1)
			go func() {
				resp, err := http.Post(f.api.URL+tc.path, "application/json", strings.NewReader(gatedBody(tc.path)))
				if err != nil {
					t.Error(err)
					close(answer)
					return
				}
				answer <- resp
			}()
			awaitChan(t, g.arrived, "the request at the engine")
			if n := booked(); n <= 0 {
				t.Fatalf("dispatched: booked %d, want the prompt's uncached tokens", n)
			}
			g.release(g.open) // the opening events (all of a chat stream but its output) go
			resp, ok := <-answer
			if !ok {
				t.Fatal("no answer")
			}
			defer resp.Body.Close()
			sse := bufio.NewReader(resp.Body)
			if tc.path == "/v1/responses" {
				readUntil(t, sse, "event: response.content_part.added")
				if n := booked(); (n > 0) != tc.wantOpened {
					t.Fatalf("after response.created, in_progress and the openers: booked %d, want booked %v", n, tc.wantOpened)
				}
				g.release(g.delta)
				readUntil(t, sse, "event: response.output_text.delta")
			} else {
				g.release(g.delta)
				readUntil(t, sse, "data: {")
			}
			if n := booked(); (n > 0) != tc.wantDelta {
				t.Fatalf("after the first output: booked %d, want booked %v", n, tc.wantDelta)
			}
			if _, err := io.Copy(io.Discard, sse); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func dynamoA(p peers.Policy, endpoint string) int {
	return p.(*peers.DynamoPolicy).ActivePrefill(endpoint)
}

func llmdTokens(p peers.Policy, endpoint string) int {
	return p.(*peers.LLMDPolicy).InflightTokens(endpoint)
}

// gatedBody is a streaming request of about 600 prompt tokens.
func gatedBody(path string) string {
	text := strings.Repeat("Gates hold answers until the test lets them go. ", 60)
	body := map[string]any{"model": "Qwen/Qwen3-0.6B", "stream": true, "input": text, "max_output_tokens": 4}
	if path != "/v1/responses" {
		body = map[string]any{"model": "Qwen/Qwen3-0.6B", "stream": true, "max_tokens": 4,
			"messages": []map[string]string{{"role": "user", "content": text}}}
	}
	b, _ := json.Marshal(body)
	return string(b)
}

// readUntil reads the stream's lines until one starting with prefix.
func readUntil(t *testing.T, r *bufio.Reader, prefix string) {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if strings.HasPrefix(line, prefix) {
			return
		}
		if err != nil {
			t.Fatalf("the stream ended (%v) before %q", err, prefix)
		}
	}
}

func awaitChan(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10 s", what)
	}
}

// gate stands between the picker and one engine: it passes everything
// through, but holds a streamed answer's events until open is released,
// and its first output delta (response.output_text.delta) until delta is.
// Both are released at the test's end, whatever happened.
type gate struct {
	url     string
	engine  *httputil.ReverseProxy
	target  string
	arrived chan struct{} // a streamed answer is asked for: the picker dispatched it
	open    chan struct{}
	delta   chan struct{}
	mu      sync.Mutex
}

// release closes c (open or delta), once.
func (g *gate) release(c chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-c:
	default:
		close(c)
	}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || (r.URL.Path != "/v1/responses" && r.URL.Path != "/v1/chat/completions") {
		g.engine.ServeHTTP(w, r)
		return
	}
	select {
	case g.arrived <- struct{}{}:
	default:
	}
	body, _ := io.ReadAll(r.Body)
	resp, err := http.Post(g.target+r.URL.Path, "application/json", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(resp.StatusCode)
	<-g.open
	rc, in, held := http.NewResponseController(w), bufio.NewReader(resp.Body), false
	for {
		line, err := in.ReadString('\n')
		if strings.HasPrefix(line, "event: response.output_text.delta") && !held {
			held = true
			<-g.delta
		}
		_, _ = io.WriteString(w, line)
		if line == "\n" {
			_ = rc.Flush()
		}
		if err != nil {
			_ = rc.Flush()
			return
		}
	}
}

// startGated starts one engine behind a gate, an in-process fleet that
// knows the engine by the gate's address, and a router over it.
func startGated(t *testing.T, cfg picker.Config) (*fleet, *gate) {
	t.Helper()
	lcfg := localfleet.DefaultConfig()
	lcfg.Params, lcfg.Health = summary.ForCapacity(capacity), cfg.Health
	lf, err := localfleet.New(lcfg)
	if err != nil {
		t.Fatal(err)
	}
	ecfg := enginesim.DefaultConfig()
	ecfg.Host, ecfg.Port, ecfg.NumGPUBlocks, ecfg.MaxModelLen = "127.0.0.1", 0, 2048, 8192
	ecfg.Sim.TimeScale, ecfg.EnableScaleOutEndpoints, ecfg.EnablePromptTokensDetails = 0, true, true
	var gateURL atomic.Pointer[string]
	ecfg.EventSink = func(b kvevents.Batch) {
		if u := gateURL.Load(); u != nil {
			if err := lf.Update(*u, &b, time.Now()); err != nil {
				t.Errorf("in-process fleet: %v", err)
			}
		}
	}
	p, err := enginesim.Start(ecfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e := p.Engines()[0]
	target, _ := url.Parse(e.URL())
	g := &gate{engine: httputil.NewSingleHostReverseProxy(target), target: e.URL(),
		arrived: make(chan struct{}, 1), open: make(chan struct{}), delta: make(chan struct{})}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	g.url = srv.URL
	gateURL.Store(&g.url)
	id := fleetpkg.Identity{Endpoint: g.url, Model: servedName(&ecfg), BlockSize: ecfg.BlockSize, NumGPUBlocks: ecfg.NumGPUBlocks,
		HashAlgo: ecfg.HashAlgo, KeyFormat: blockkey.FormatV1, TokenizerFingerprint: "inproc"}
	if err := lf.Add(id, time.Now()); err != nil {
		t.Fatal(err)
	}
	lf.SetLoad(g.url, fleetpkg.Load{}, time.Now())
	f := &fleet{view: lf, local: lf, engines: []*enginesim.Engine{e}}
	f.serve(t, cfg, "")
	// First of the cleanups: no answer is left held while the servers
	// close (they wait for their requests).
	t.Cleanup(func() { g.release(g.open); g.release(g.delta) })
	return f, g
}

// TestPeerSGLangResponsesText: through the picker, SMG's policy reads a
// /v1/responses body as SMG does, without function_call arguments and
// function_call_output outputs: a second turn whose new tool output is
// ten times the task still matches the first turn's text whole and goes
// where it ran (cache_hit). Were the output part of the text, the match
// rate would fall under 0.3 and the least-loaded endpoint that has
// processed fewer requests — another one — would get it (min_load).
func TestPeerSGLangResponsesText(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.Score.Policy = score.SGLang
	f := startFleet(t, 3, cfg, "")
	task := map[string]any{"role": "user", "content": strings.Repeat("List the files and summarise them. ", 20)}
	body := func(input ...any) string {
		b, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "instructions": "You are terse.", "input": input,
			"max_output_tokens": 4, "cache_salt": "sgl-responses"})
		return string(b)
	}
	resp, err := http.Post(f.api.URL+"/v1/responses", "application/json", strings.NewReader(body(task)))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	warm := resp.Header.Get("X-Kvroute-Endpoint")
	if resp.StatusCode != http.StatusOK || warm == "" {
		t.Fatalf("turn 1: %d", resp.StatusCode)
	}
	call := map[string]any{"type": "function_call", "call_id": "c1", "name": "ls", "arguments": `{"dir":"."}`}
	output := map[string]any{"type": "function_call_output", "call_id": "c1", "output": strings.Repeat("file-0001.txt 4096 bytes\n", 300)}
	code, a, raw := f.pick(t, body(task, call, output), nil, "")
	if code != http.StatusOK {
		t.Fatalf("turn 2: %d %s", code, raw)
	}
	if a.Reason != "cache_hit" || a.Endpoint != warm {
		t.Fatalf("turn 2: %s to %s, want cache_hit to %s (turn 1's)", a.Reason, a.Endpoint, warm)
	}
}

// TestPeerLLMDLoadGate: SetLLMDLoadGate reaches the llm-d policy (peak
// and penalty, kept for the router's life), refuses values out of range
// without a change, and is refused by a router running another policy.
func TestPeerLLMDLoadGate(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.Score.Policy = score.LLMD
	f := startFleet(t, 1, cfg, "")
	gate := func() (peak, ms float64) {
		f.router.WithPeerPolicy(func(p peers.Policy) { peak, ms = p.(*peers.LLMDPolicy).LoadGate() })
		return peak, ms
	}
	if peak, ms := gate(); peak != 15928 || ms != 18000 {
		t.Fatalf("defaults %v tok/s, %v ms; want the guide's 15928, 18000", peak, ms)
	}
	if err := f.router.SetLLMDLoadGate(9706, 18*time.Second); err != nil {
		t.Fatal(err)
	}
	if peak, ms := gate(); peak != 9706 || ms != 18000 {
		t.Fatalf("set: %v tok/s, %v ms", peak, ms)
	}
	if err := f.router.SetLLMDLoadGate(0, time.Second); err == nil {
		t.Fatal("a peak of 0 accepted")
	}
	if peak, ms := gate(); peak != 9706 || ms != 18000 {
		t.Fatalf("a refused value changed the gate: %v tok/s, %v ms", peak, ms)
	}
	cfg.Score.Policy = score.Dynamo
	if err := startFleet(t, 1, cfg, "").router.SetLLMDLoadGate(9706, time.Second); err == nil {
		t.Fatal("a dynamo router took an llm-d load gate")
	}
	cfg.Score.Policy = score.Precise
	if err := startFleet(t, 1, cfg, "").router.SetLLMDLoadGate(9706, time.Second); err == nil {
		t.Fatal("a precise router took an llm-d load gate")
	}
}

// TestAdmitAll: with admission's limits set so that one request's
// prefill in flight saturates the only endpoint and nothing may queue,
// a second request is refused (429); after AdmitAll it is admitted at
// once, the first still in flight.
func TestAdmitAll(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.Admission.MaxWaiting, cfg.Admission.MaxKVUsage, cfg.Admission.MaxPrefillTokens, cfg.Admission.QueueSize = 0, 0, 1, 0
	f, g := startGated(t, cfg)
	send := func() <-chan int {
		code := make(chan int, 1)
		go func() {
			resp, err := http.Post(f.api.URL+"/v1/responses", "application/json", strings.NewReader(gatedBody("/v1/responses")))
			if err != nil {
				code <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			code <- resp.StatusCode
		}()
		return code
	}
	first := send()
	awaitChan(t, g.arrived, "the first request at the engine") // its prefill is in flight: saturated
	if code := <-send(); code != http.StatusTooManyRequests {
		t.Fatalf("a second request while saturated: %d, want 429", code)
	}
	f.router.AdmitAll()
	second := send()
	awaitChan(t, g.arrived, "the second request at the engine, admitted at once")
	g.release(g.open)
	g.release(g.delta)
	if a, b := <-first, <-second; a != http.StatusOK || b != http.StatusOK {
		t.Fatalf("answers %d, %d", a, b)
	}
}
