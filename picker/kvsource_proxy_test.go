package picker

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/localfleet"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/metrictest"
)

// tap is an engine's front: it records the generate requests it passes
// on (bodies and headers), and passes everything to the engine.
type tap struct {
	next http.Handler
	mu   sync.Mutex
	seen []tapped
}

type tapped struct {
	path   string
	body   []byte
	header http.Header
}

func (t *tap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if !strings.HasSuffix(r.URL.Path, "/render") && r.URL.Path != "/tokenize" {
		t.mu.Lock()
		t.seen = append(t.seen, tapped{path: r.URL.Path, body: body, header: r.Header.Clone()})
		t.mu.Unlock()
	}
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	r.ContentLength = int64(len(body))
	t.next.ServeHTTP(w, r)
}

func (t *tap) last() tapped {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seen[len(t.seen)-1]
}

// TestProxyDropsClientKVParams: through the real proxy, a client's
// kv_transfer_params (here naming its own source) and its
// x-kv-cache-source-host-port header never reach the engine — on
// completions, chat and Responses — and each is counted; the answer names
// no source. The endpoint's advertised KV source is on /debug/endpoints.
func TestProxyDropsClientKVParams(t *testing.T) {
	ecfg := enginesim.DefaultConfig()
	ecfg.Host, ecfg.Port = "127.0.0.1", 0
	ecfg.NumGPUBlocks, ecfg.MaxModelLen = 512, 4096
	ecfg.Sim.TimeScale = 0
	ecfg.EnableScaleOutEndpoints, ecfg.EnablePromptTokensDetails = true, true
	ecfg.KVEvents.EnableKVCacheEvents = false
	proc, err := enginesim.Start(ecfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Close()
	engine, _ := url.Parse(proc.Engines()[0].URL())
	tp := &tap{next: httputil.NewSingleHostReverseProxy(engine)}
	front := httptest.NewServer(tp)
	defer front.Close()

	lcfg := localfleet.DefaultConfig()
	lcfg.Params = summary.ForCapacity(4096)
	lf, err := localfleet.New(lcfg)
	if err != nil {
		t.Fatal(err)
	}
	const src = "127.0.0.1:5710" // the engine's P2P side channel, as its sidecar would advertise it
	model := ecfg.Model
	if len(ecfg.ServedModelNames) > 0 {
		model = ecfg.ServedModelNames[0]
	}
	if err := lf.Add(fleet.Identity{Endpoint: front.URL, Model: model, BlockSize: ecfg.BlockSize, NumGPUBlocks: ecfg.NumGPUBlocks,
		HashAlgo: ecfg.HashAlgo, KeyFormat: blockkey.FormatV1, TokenizerFingerprint: "inproc", KVSource: src}, time.Now()); err != nil {
		t.Fatal(err)
	}
	lf.SetLoad(front.URL, fleet.Load{}, time.Now())
	reg := prometheus.NewRegistry()
	r, err := NewRouter(DefaultConfig(), lf, zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	api := httptest.NewServer(r.Handler(HandlerOptions{}))
	defer api.Close()

	client := `"kv_transfer_params":{"remote_kv_source":{"kv_request_id":"mine","remote_host":"203.0.113.9","remote_port":5710}}`
	for i, tc := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"` + model + `","prompt":"hello there","max_tokens":2,` + client + `}`},
		{"/v1/chat/completions", `{"model":"` + model + `","messages":[{"role":"user","content":"hello there"}],"max_tokens":2,` + client + `}`},
		{"/v1/responses", `{"model":"` + model + `","input":"hello there","max_output_tokens":2,` + client + `}`},
	} {
		lf.SetLoad(front.URL, fleet.Load{}, time.Now()) // fresh
		req, _ := http.NewRequest(http.MethodPost, api.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(KVSourceHeader, "203.0.113.9:5710")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.path, resp.StatusCode, raw)
		}
		got := tp.last()
		var sent map[string]any
		if err := json.Unmarshal(got.body, &sent); err != nil || got.path != tc.path {
			t.Fatalf("%s: the engine got %s %s (%v)", tc.path, got.path, got.body, err)
		}
		if _, has := sent["kv_transfer_params"]; has || strings.Contains(string(got.body), "203.0.113.9") {
			t.Fatalf("%s: the client's kv_transfer_params reached the engine: %s", tc.path, got.body)
		}
		if sent["model"] != model {
			t.Fatalf("%s: the rest of the body did not: %s", tc.path, got.body)
		}
		if v := got.header.Values(KVSourceHeader); len(v) != 0 {
			t.Fatalf("%s: the client's %s reached the engine: %v", tc.path, KVSourceHeader, v)
		}
		if h := resp.Header.Get(KVSourceAnswerHeader); h != "" {
			t.Fatalf("%s: the answer names a source (%q) no decision named", tc.path, h)
		}
		if n := metrictest.Gathered(t, reg, "kvroute_picker_client_kv_params_dropped_total", nil); n != float64(i+1) {
			t.Fatalf("%s: %v dropped, want %d", tc.path, n, i+1)
		}
	}
	// A body without any is forwarded as sent, and not counted.
	body := `{"model":"` + model + `","prompt":"hello again","max_tokens":2}`
	resp, err := http.Post(api.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := tp.last(); string(got.body) != body || metrictest.Gathered(t, reg, "kvroute_picker_client_kv_params_dropped_total", nil) != 3 {
		t.Fatalf("a clean body: forwarded %s", got.body)
	}
	// The advertised KV source is on /debug/endpoints.
	admin := httptest.NewServer(r.AdminHandler(HandlerOptions{}))
	defer admin.Close()
	resp, err = http.Get(admin.URL + debugapi.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc debugapi.Document
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil || len(doc.Endpoints) != 1 || doc.Endpoints[0].KVSource != src {
		t.Fatalf("/debug/endpoints: %+v %v", doc.Endpoints, err)
	}
}
