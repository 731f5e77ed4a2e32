package enginesim

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap"
)

// FuzzHTTP feeds arbitrary bodies to every POST endpoint: the engine
// answers with a status below 500 and never panics.
func FuzzHTTP(f *testing.F) {
	cfg := DefaultConfig()
	cfg.Host, cfg.Port = "127.0.0.1", 0
	cfg.NumGPUBlocks, cfg.MaxModelLen = 1024, 2048
	cfg.Sim.TimeScale = 0
	cfg.EnableScaleOutEndpoints = true
	p, err := Start(cfg, zap.NewNop())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(p.Close)
	h := p.Engines()[0].handler()
	paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/chat/completions/render",
		"/v1/completions/render", "/v1/responses/render", "/tokenize", "/detokenize", "/sim/faults"}
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		`{"prompt":[1,2,3],"max_tokens":1,"stream":true}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}],"max_output_tokens":1}`,
		`{"tokens":[1000,1001]}`,
		`{"drop_events_pct":-1}`,
		`{"prompt":"x","max_tokens":-5}`,
	} {
		for i := range paths {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, path uint8, body []byte) {
		req := httptest.NewRequest(http.MethodPost, paths[int(path)%len(paths)], bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %q: status %d: %s", req.URL.Path, body, rec.Code, rec.Body.String())
		}
	})
}
