package picker_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/score"
)

// TestPeerPolicies: each peer policy runs through the real picker — the
// decision API says it decided, the proxy serves streaming and
// non-streaming requests through it, and a conversation's second turn goes
// where its first ran (each peer has its own cache signal: llm-d and sglang
// their routing history, llm-d-precise and dynamo the fleet index).
func TestPeerPolicies(t *testing.T) {
	for _, p := range score.PeerPolicies() {
		t.Run(string(p), func(t *testing.T) {
			cfg := picker.DefaultConfig()
			cfg.Score.Policy = p
			f := startFleet(t, 3, cfg, "")
			first := chatBody("peer-"+string(p), strings.Repeat("Tell me about caches. ", 30))
			code, p1, raw := f.pick(t, first, nil, "?explain=true")
			if code != http.StatusOK || p1.Policy != string(p) || p1.Endpoint == "" || len(p1.Candidates) != 3 {
				t.Fatalf("turn 1: %d %s", code, raw)
			}
			// Through the proxy, so the policy books it and sees it end.
			resp, err := http.Post(f.api.URL+"/v1/chat/completions", "application/json", strings.NewReader(first))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			warm := resp.Header.Get("X-Kvroute-Endpoint")
			if resp.StatusCode != http.StatusOK || warm == "" {
				t.Fatalf("proxied turn 1: %d", resp.StatusCode)
			}
			f.awaitHeld(t, warm, first)
			f.awaitLoadReports(t)
			second := chatBody("peer-"+string(p), strings.Repeat("Tell me about caches. ", 30), "Caches keep things.", "And KV caches?")
			for _, stream := range []bool{false, true} {
				body := second
				if stream {
					body = strings.Replace(second, `"max_tokens":8`, `"max_tokens":8,"stream":true`, 1)
				}
				resp, err := http.Post(f.api.URL+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || (stream && !strings.Contains(string(b), "[DONE]")) {
					t.Fatalf("turn 2 (stream %v): %d %s", stream, resp.StatusCode, b)
				}
				if got := resp.Header.Get("X-Kvroute-Endpoint"); got != warm {
					t.Fatalf("turn 2 (stream %v) went to %s, turn 1 ran on %s", stream, got, warm)
				}
			}
		})
	}
}
