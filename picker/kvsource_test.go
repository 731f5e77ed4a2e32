package picker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/extproc"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/pickapi"
	"github.com/kvroute/kvroute/test/metrictest"
)

// kvGroup is an identity group of three endpoints: the two ranks of
// 10.0.0.2 run a P2P tier, 10.0.0.1 does not.
func kvGroup() []*fleet.Endpoint {
	return []*fleet.Endpoint{
		{URL: "http://10.0.0.1:8000", Info: fleet.Identity{Endpoint: "http://10.0.0.1:8000"}},
		{URL: "http://10.0.0.2:8000", Info: fleet.Identity{Endpoint: "http://10.0.0.2:8000", KVSource: "10.0.0.2:5710"}},
		{URL: "http://10.0.0.2:8001", Info: fleet.Identity{Endpoint: "http://10.0.0.2:8001", KVSource: "10.0.0.2:5711"}},
	}
}

// TestSourceOf: a decision's source reaches the wire only as the
// advertised address of another endpoint of the request's group; the
// chosen endpoint itself, an endpoint outside the group, or one without
// an address is dropped, with the reason counted.
func TestSourceOf(t *testing.T) {
	for _, tc := range []struct {
		name         string
		chosen, src  string
		tokens       int
		want         kvSource
		wantDropped  string
		outsideGroup bool
	}{
		{"none named", "http://10.0.0.1:8000", "", 0, kvSource{}, "", false},
		{"another endpoint of the group", "http://10.0.0.1:8000", "http://10.0.0.2:8000", 4096,
			kvSource{url: "http://10.0.0.2:8000", addr: "10.0.0.2:5710", tokens: 4096}, "", false},
		{"another rank of the same pod", "http://10.0.0.2:8000", "http://10.0.0.2:8001", 512,
			kvSource{url: "http://10.0.0.2:8001", addr: "10.0.0.2:5711", tokens: 512}, "", false},
		{"the computing endpoint itself", "http://10.0.0.2:8000", "http://10.0.0.2:8000", 4096, kvSource{}, sourceIsComputing, false},
		{"an endpoint outside the group", "http://10.0.0.1:8000", "http://10.9.9.9:8000", 4096, kvSource{}, sourceNotInGroup, true},
		{"an endpoint without a P2P tier", "http://10.0.0.2:8000", "http://10.0.0.1:8000", 4096, kvSource{}, sourceNoAddress, false},
		{"negative tokens read as none", "http://10.0.0.1:8000", "http://10.0.0.2:8000", -3,
			kvSource{url: "http://10.0.0.2:8000", addr: "10.0.0.2:5710"}, "", false},
	} {
		d := decide.Decision{Endpoint: tc.chosen, Source: tc.src, SourceTokens: tc.tokens}
		got, dropped := sourceOf(&d, kvGroup())
		if got != tc.want || dropped != tc.wantDropped {
			t.Errorf("%s: %+v, dropped %q; want %+v, %q", tc.name, got, dropped, tc.want, tc.wantDropped)
		}
	}
	// No endpoint chosen: nothing to pull for.
	if got, dropped := sourceOf(&decide.Decision{Source: "http://10.0.0.2:8000"}, kvGroup()); got != (kvSource{}) || dropped != "" {
		t.Errorf("no endpoint chosen: %+v, %q", got, dropped)
	}
}

// TestDropKVParams: every top-level kv_transfer_params a client sent is
// removed, however written; everything else stays, and text that merely
// mentions the name is untouched.
func TestDropKVParams(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		dropped    bool
	}{
		{"none", `{"model":"m","prompt":"x"}`, false},
		{"a source", `{"model":"m","prompt":"x","kv_transfer_params":{"remote_kv_source":{"kv_request_id":"r","remote_host":"203.0.113.9","remote_port":5710}}}`, true},
		{"null", `{"kv_transfer_params":null,"model":"m","prompt":"x"}`, true},
		{"two copies", `{"kv_transfer_params":{},"model":"m","kv_transfer_params":{"remote_decoder":{}},"prompt":"x"}`, true},
		{"an escaped key", `{"kv\u005ftransfer_params":{"remote_kv_source":{}},"model":"m","prompt":"x"}`, true},
		{"named in the text only", `{"model":"m","messages":[{"role":"user","content":"what is \"kv_transfer_params\"? \u00e9"}]}`, false},
		{"nested, not top-level", `{"model":"m","prompt":"x","extra":{"kv_transfer_params":{}}}`, false},
		{"not an object", `["kv_transfer_params"]`, false},
		{"not JSON", `{"kv_transfer_params":`, false},
	} {
		out, dropped := dropKVParams([]byte(tc.body))
		if dropped != tc.dropped {
			t.Errorf("%s: dropped %v, want %v (%s)", tc.name, dropped, tc.dropped, out)
			continue
		}
		if !dropped {
			if string(out) != tc.body {
				t.Errorf("%s: a body with nothing to drop was rewritten: %s", tc.name, out)
			}
			continue
		}
		var got, want map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: %s: %v", tc.name, out, err)
		}
		_ = json.Unmarshal([]byte(tc.body), &want)
		delete(want, "kv_transfer_params")
		if _, has := got["kv_transfer_params"]; has || !reflect.DeepEqual(got, want) || strings.Contains(string(out), "transfer") {
			t.Errorf("%s: %s, want the other members as sent: %v", tc.name, out, want)
		}
	}
}

// TestWithKVSource: the remote_kv_source is spliced into the body, every
// member kept byte for byte, whatever the body's spacing.
func TestWithKVSource(t *testing.T) {
	for _, tc := range []struct{ body, addr, host string }{
		{`{}`, "10.0.0.2:5710", "10.0.0.2"},
		{"{ \n}", "10.0.0.2:5710", "10.0.0.2"},
		{`{"model":"m","temperature":0.70,"seed":12345678901234567890,"prompt":"x"}`, "10.0.0.2:5711", "10.0.0.2"},
		{"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"}\"}]}\n", "[fd00::7]:5710", "fd00::7"},
	} {
		out, err := withKVSource([]byte(tc.body), tc.addr, "id-1")
		if err != nil {
			t.Fatalf("%q: %v", tc.body, err)
		}
		var v map[string]json.RawMessage
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("%q: %s is not JSON: %v", tc.body, out, err)
		}
		var kv struct {
			Source struct {
				ID   string `json:"kv_request_id"`
				Host string `json:"remote_host"`
				Port int    `json:"remote_port"`
			} `json:"remote_kv_source"`
		}
		if err := json.Unmarshal(v["kv_transfer_params"], &kv); err != nil || kv.Source.ID != "id-1" || kv.Source.Host != tc.host ||
			!strings.HasSuffix(tc.addr, ":"+fmtPort(kv.Source.Port)) {
			t.Fatalf("%q: kv_transfer_params %s (%v)", tc.body, v["kv_transfer_params"], err)
		}
		if i := bytes.Index(out, []byte(`"kv_transfer_params"`)); !bytes.HasPrefix([]byte(tc.body), bytes.TrimRight(out[:i], ",")) {
			t.Fatalf("%q: the members before the splice changed: %s", tc.body, out)
		}
		if strings.Contains(tc.body, "12345678901234567890") && !bytes.Contains(out, []byte("0.70,\"seed\":12345678901234567890")) {
			t.Fatalf("numbers rewritten: %s", out)
		}
	}
	for _, bad := range []struct{ body, addr string }{{`[1]`, "10.0.0.2:5710"}, {``, "10.0.0.2:5710"}, {`}`, "10.0.0.2:5710"},
		{`{}`, "10.0.0.2"}, {`{}`, "10.0.0.2:0"}, {`{}`, "10.0.0.2:x"}} {
		if out, err := withKVSource([]byte(bad.body), bad.addr, "id"); err == nil {
			t.Errorf("%q with %q: %s, want an error", bad.body, bad.addr, out)
		}
	}
}

func fmtPort(p int) string { b, _ := json.Marshal(p); return string(b) }

// TestKVRequestIDs: each transfer gets a fresh random UUID.
func TestKVRequestIDs(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := newKVRequestID()
		if !re.MatchString(id) || seen[id] {
			t.Fatalf("id %q (seen before: %v)", id, seen[id])
		}
		seen[id] = true
	}
}

// bodyRecorder is an engine that records what it was sent and answers a
// whole JSON answer.
type bodyRecorder struct {
	mu      sync.Mutex
	bodies  [][]byte
	headers []http.Header
}

func (b *bodyRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.bodies, b.headers = append(b.bodies, body), append(b.headers, r.Header.Clone())
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"object":"chat.completion","choices":[],"usage":{"prompt_tokens":3}}`)
}

func (b *bodyRecorder) last() ([]byte, http.Header) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bodies[len(b.bodies)-1], b.headers[len(b.headers)-1]
}

// TestForwardCarriesTheSource: a pick with a KV source reaches the engine
// with kv_transfer_params.remote_kv_source naming the source's advertised
// address and a fresh transfer id, on completions, chat and Responses
// bodies alike, the rest of the body as sent; the client's source header
// is not passed on; the answer names the source (x-kvroute-kv-source)
// under --response-headers all only. A pick without one forwards the body
// as received.
func TestForwardCarriesTheSource(t *testing.T) {
	rec := &bodyRecorder{}
	up := httptest.NewServer(rec)
	defer up.Close()
	r := &Router{cfg: DefaultConfig(), proxy: &http.Client{Transport: newProxyTransport()}, log: zap.NewNop()}
	r.m = newMetrics(prometheus.NewRegistry(), r)
	bodies := map[string]struct {
		kind intake.Kind
		body string
	}{
		"/v1/completions":      {intake.Completion, `{"model":"m","prompt":"hello","max_tokens":2}`},
		"/v1/chat/completions": {intake.Chat, `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`},
		"/v1/responses":        {intake.Responses, `{"model":"m","input":"hello","max_output_tokens":2}`},
	}
	ids := map[string]bool{}
	for path, b := range bodies {
		for _, mode := range []string{HeadersAll, HeadersDecision} {
			r.cfg.ResponseHeaders = mode
			src := kvSource{url: "http://10.0.0.2:8000", addr: "10.0.0.2:5710", tokens: 4096}
			p := &Pick{Answer: pickapi.Answer{Endpoint: up.URL, KVSource: src.addr, KVSourceTokens: src.tokens}, source: src, kind: b.kind}
			w := httptest.NewRecorder()
			in := httptest.NewRequest(http.MethodPost, path, nil)
			in.Header.Set(KVSourceHeader, "203.0.113.9:5710") // a client naming its own source
			if done, err := r.forward(w, in, p, b.kind, path, []byte(b.body)); !done || err != nil {
				t.Fatalf("%s: %v %v", path, done, err)
			}
			sent, hdr := rec.last()
			var got map[string]any
			if err := json.Unmarshal(sent, &got); err != nil {
				t.Fatalf("%s: forwarded %s: %v", path, sent, err)
			}
			kv, _ := got["kv_transfer_params"].(map[string]any)
			rs, _ := kv["remote_kv_source"].(map[string]any)
			id, _ := rs["kv_request_id"].(string)
			if len(kv) != 1 || rs["remote_host"] != "10.0.0.2" || rs["remote_port"] != float64(5710) || len(rs) != 3 || id == "" || ids[id] {
				t.Fatalf("%s: forwarded kv_transfer_params %v, want a remote_kv_source of 10.0.0.2:5710 with a fresh id", path, kv)
			}
			ids[id] = true
			delete(got, "kv_transfer_params")
			var want map[string]any
			_ = json.Unmarshal([]byte(b.body), &want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: the rest of the body %v, sent %v", path, got, want)
			}
			if v := hdr.Values(KVSourceHeader); len(v) != 0 {
				t.Fatalf("%s: the client's %s reached the engine: %v", path, KVSourceHeader, v)
			}
			if h := w.Result().Header.Get(KVSourceAnswerHeader); (mode == HeadersAll) != (h == "10.0.0.2:5710") || (mode != HeadersAll && h != "") {
				t.Fatalf("%s, --response-headers %s: %s %q", path, mode, KVSourceAnswerHeader, h)
			}
		}
	}
	// No source: the body goes as received, and no header names one.
	r.cfg.ResponseHeaders = HeadersAll
	w := httptest.NewRecorder()
	body := `{"model":"m","prompt":"hello"}`
	p := &Pick{Answer: pickapi.Answer{Endpoint: up.URL}}
	if done, err := r.forward(w, httptest.NewRequest(http.MethodPost, "/v1/completions", nil), p, intake.Completion, "/v1/completions", []byte(body)); !done || err != nil {
		t.Fatal(done, err)
	}
	if sent, _ := rec.last(); string(sent) != body || w.Result().Header.Get(KVSourceAnswerHeader) != "" {
		t.Fatalf("without a source: forwarded %s, answer header %q", sent, w.Result().Header.Get(KVSourceAnswerHeader))
	}
}

// TestSourceMetrics: a pick naming a source counts it by the source's
// engine (with --per-endpoint-metrics; else in the one series of all
// sources) with its tokens; a dropped one by reason; the decision's plan
// by place.
func TestSourceMetrics(t *testing.T) {
	for _, perEndpoint := range []bool{false, true} {
		t.Run(fmt.Sprintf("per-endpoint=%v", perEndpoint), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r := &Router{cfg: DefaultConfig()}
			r.cfg.PerEndpointMetrics = perEndpoint
			r.m = newMetrics(reg, r)
			d := decide.Decision{Endpoint: "http://10.0.0.1:8000", Source: "http://10.0.0.2:8000", SourceTokens: 4096,
				Plan: decide.Placement{GPU: 64, CPU: 32, Pulled: 4096, Recompute: 100}}
			p := &Pick{}
			p.source, p.sourceDropped = sourceOf(&d, kvGroup())
			r.m.observe(&notes{}, &d, p)
			d2 := decide.Decision{Endpoint: "http://10.0.0.2:8000", Source: "http://10.0.0.2:8000", SourceTokens: 100}
			p2 := &Pick{}
			p2.source, p2.sourceDropped = sourceOf(&d2, kvGroup())
			r.m.observe(&notes{}, &d2, p2)
			bySource := 0.0 // the source's own series: only per endpoint
			if perEndpoint {
				bySource = 1
			}
			for _, c := range []struct {
				name, label, value string
				want               float64
			}{
				{"kvroute_picker_kv_sources_total", "", "", 1},
				{"kvroute_picker_kv_sources_total", "engine", "http://10.0.0.2:8000", bySource},
				{"kvroute_picker_kv_pull_tokens_total", "", "", 4096},
				{"kvroute_picker_kv_sources_dropped_total", "reason", sourceIsComputing, 1},
				{"kvroute_picker_kv_sources_dropped_total", "reason", sourceNotInGroup, 0},
				{"kvroute_picker_planned_prompt_tokens_total", "place", "gpu", 64},
				{"kvroute_picker_planned_prompt_tokens_total", "place", "cpu", 32},
				{"kvroute_picker_planned_prompt_tokens_total", "place", "pulled", 4096},
				{"kvroute_picker_planned_prompt_tokens_total", "place", "recomputed", 100},
			} {
				var labels map[string]string
				if c.label != "" {
					labels = map[string]string{c.label: c.value}
				}
				got := metrictest.Gathered(t, reg, c.name, labels)
				if got != c.want {
					t.Errorf("%s{%s=%q} = %v, want %v", c.name, c.label, c.value, got, c.want)
				}
			}
		})
	}
}

// TestPickResponseCarriesTheSource: the gRPC decision API answers the
// source as the HTTP one does.
func TestPickResponseCarriesTheSource(t *testing.T) {
	p := &Pick{Answer: pickapi.Answer{Endpoint: "http://10.0.0.1:8000", KVSource: "10.0.0.2:5710", KVSourceTokens: 4096}}
	if out := pickResponse(p); out.GetKvSource() != "10.0.0.2:5710" || out.GetKvSourceTokens() != 4096 || out.GetEndpoint() != p.Endpoint {
		t.Fatalf("%v", out)
	}
	b, _ := json.Marshal(p)
	if !bytes.Contains(b, []byte(`"kv_source":"10.0.0.2:5710","kv_source_tokens":4096`)) {
		t.Fatalf("HTTP answer %s", b)
	}
}

// TestEPPSourceHeader: the endpoint picker's routing answer sets llm-d's
// source header (replacing any the client sent) when the decision named
// a source, and removes the client's when it did not.
func TestEPPSourceHeader(t *testing.T) {
	for _, src := range []string{"10.0.0.2:5710", ""} {
		x := &eppExchange{rec: &reqRecord{id: "r", cached: -1}, pick: &Pick{Answer: pickapi.Answer{Endpoint: "http://10.0.0.1:8000", KVSource: src}}}
		set, remove := x.decisionHeaders()
		m := eppResponse(extproc.Reply{Kind: extproc.RequestHeaders, Route: "10.0.0.1:8000"}, set, remove)
		mut := m.GetRequestHeaders().GetResponse().GetHeaderMutation()
		var got []*corev3.HeaderValueOption
		for _, h := range mut.GetSetHeaders() {
			if strings.EqualFold(h.GetHeader().GetKey(), KVSourceHeader) {
				got = append(got, h)
			}
		}
		removed := false
		for _, h := range mut.GetRemoveHeaders() {
			removed = removed || strings.EqualFold(h, KVSourceHeader)
		}
		switch {
		case src != "" && (len(got) != 1 || string(got[0].GetHeader().GetRawValue()) != src ||
			got[0].GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD || removed):
			t.Fatalf("source %s: set %v, removed %v", src, got, removed)
		case src == "" && (len(got) != 0 || !removed):
			t.Fatalf("no source: set %v, removed %v", got, removed)
		}
	}
}
