package enginesim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/testnet"
)

// TestResetWhileBusy: /reset_prefix_cache while a request runs cannot
// reset (its blocks are in use) and answers 200 as vLLM does, counting
// the failure — it used to panic on a nil counter — and the engine serves
// on.
func TestResetWhileBusy(t *testing.T) {
	cfg := testConfig()
	cfg.Sim.TimeScale = 1 // real time: the request below runs for seconds
	e := start(t, cfg).Engines()[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, _ := json.Marshal(map[string]any{"prompt": "a long answer please", "max_tokens": 400, "ignore_eos": true, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if st, err := e.Stats(); err != nil || st.Running != 1 {
			return fmt.Errorf("running %+v %v", st, err)
		}
		return nil
	})
	if code := post(t, e.URL()+"/reset_prefix_cache", nil, nil); code != 200 {
		t.Fatalf("reset while busy: %d", code)
	}
	if v := scraped(t, e, "kvroute_engine_reset_prefix_cache_failures_total", nil); v != 1 {
		t.Fatalf("reset failures counted: %v, want 1", v)
	}
	if code := post(t, e.URL()+"/reset_prefix_cache?reset_running_requests=true", nil, nil); code != 200 {
		t.Fatalf("reset with reset_running_requests: %d", code)
	}
}
