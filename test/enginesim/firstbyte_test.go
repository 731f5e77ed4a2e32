package enginesim_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/testnet"
)

// TestChatStreamBodyWaitsForPrefill: as vLLM's server, a streaming chat
// answer's headers go at once, and its first body byte (the role chunk)
// only with the request's first output, after its prefill: the time to
// first byte a proxy sees is the time to first token.
func TestChatStreamBodyWaitsForPrefill(t *testing.T) {
	cfg := testConfig()
	// A prefill of ~16 s in steps of 64 tokens (~0.25 s each): the
	// scheduler answers between steps, and the prefill lasts the test.
	cfg.Sim.TimeScale, cfg.Sim.PrefillTokensPerSecond, cfg.MaxNumBatchedTokens = 1, 250, 64
	e := start(t, cfg).Engines()[0]
	addr := strings.TrimPrefix(e.URL(), "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"` + cfg.Model + `","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("hello there ", 1300) + `"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no headers while the request prefills: %v", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("%s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	// The request is in the engine (prefilling) ...
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		st, err := e.Stats()
		if err != nil {
			return err
		}
		if st.Running+st.Waiting != 1 {
			return fmt.Errorf("running %d, waiting %d", st.Running, st.Waiting)
		}
		return nil
	})
	// ... and not one body byte has come: a read that cannot wait finds
	// nothing buffered.
	_ = conn.SetReadDeadline(time.Now())
	b := make([]byte, 1)
	n, err := br.Read(b)
	var ne net.Error
	if n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a body byte before the first output: %d bytes, %v", n, err)
	}
}
