package picker_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/extproc"
)

// TestEPPAccessLog: every request through the endpoint picker gets one
// access-log line and one count in kvroute_picker_requests_total, as a
// proxied request does (route ext_proc, the line saying via ext_proc):
// served ones with their endpoint, model, tokens, status and cached
// tokens; a refusal with its status; one whose answer the gateway did not
// report as unreported. The client's x-request-id names its line and goes
// on upstream; no line carries prompt text.
func TestEPPAccessLog(t *testing.T) {
	f := startFleet(t, 2, picker.DefaultConfig(), "")
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	r, err := picker.NewRouter(picker.DefaultConfig(), f.view, zap.New(core), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	conn := serveEPP(t, r, extproc.DefaultConfig())
	const prompt = "Tell me about access logs, secretly. "
	served := 0
	for i, mode := range modes() {
		g := openGateway(t, conn, mode)
		g.extra = append(g.extra, header("x-request-id", "req-"+strconv.Itoa(i)))
		body := chatBody("log", strings.Repeat(prompt, 10), strconv.Itoa(i))
		route, refused := g.sendRequest([]byte(body), nil)
		if refused != nil {
			t.Fatalf("%v: refused: %v", mode, refused)
		}
		if g.set["x-request-id"] != "req-"+strconv.Itoa(i) {
			t.Fatalf("%v: x-request-id %q sent on, want the client's", mode, g.set["x-request-id"])
		}
		addr := strings.Split(route, ",")[0]
		resp, raw := forward(t, addr, body)
		g.sendResponse(addr, resp, raw)
		served++
	}
	// A refusal: an unknown model.
	g := openGateway(t, conn, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if _, refused := g.sendRequest([]byte(strings.Replace(chatBody("log", prompt), "Qwen/Qwen3-0.6B", "no-such-model", 1)), nil); refused == nil {
		t.Fatal("an unknown model was routed")
	}
	g.end()
	// Routed, and the gateway ends the stream without the answer.
	g = openGateway(t, conn, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
	if _, refused := g.sendRequest([]byte(chatBody("log", prompt, "unanswered")), nil); refused != nil {
		t.Fatalf("refused: %v", refused)
	}
	g.end()
	const n = 5
	var lines []observer.LoggedEntry
	for _, e := range logs.All() {
		if e.LoggerName == "access" {
			lines = append(lines, e)
		}
	}
	if len(lines) != n {
		t.Fatalf("%d access-log lines for %d requests", len(lines), n)
	}
	statuses := map[string]int{}
	for i, e := range lines {
		m := e.ContextMap()
		if m["via"] != "ext_proc" || m["route"] != "ext_proc" || m["request_id"] == "" || m["method"] != "POST" {
			t.Fatalf("line %d: %v", i, m)
		}
		if i < served {
			if m["request_id"] != "req-"+strconv.Itoa(i) || m["endpoint"] == nil || m["model"] != "Qwen/Qwen3-0.6B" || m["prompt_tokens"] == nil ||
				m["cached_tokens"] == nil || m["result"] != "picked" || m["status"] != int64(200) {
				t.Fatalf("served line %d: %v", i, m)
			}
		}
		statuses[fmt.Sprint(m["status"])]++
		for k, v := range m {
			if strings.Contains(fmt.Sprint(v), "secretly") {
				t.Fatalf("line %d: prompt text in %s", i, k)
			}
		}
	}
	if statuses["200"] != served || statuses["404"] != 1 || statuses["<nil>"] != 1 {
		t.Fatalf("statuses %v", statuses)
	}
	if v, _ := series(t, reg, "kvroute_picker_requests_total", map[string]string{"route": "ext_proc"}); v != n {
		t.Fatalf("requests_total{route=ext_proc} %v, want %d", v, n)
	}
	for code, want := range map[string]float64{"200": float64(served), "404": 1, "unreported": 1} {
		if v, _ := series(t, reg, "kvroute_picker_requests_total", map[string]string{"route": "ext_proc", "code": code}); v != want {
			t.Errorf("requests_total{route=ext_proc,code=%s} %v, want %v", code, v, want)
		}
	}
}
