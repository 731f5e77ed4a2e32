package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"
)

// idleCloser is an HTTP server that loses the keep-alive race every time:
// on each connection it answers the first request (a streamed completion
// with usage, kept alive: no Connection: close) and, when a second request
// comes on it, reads it and closes the connection without a byte, as a
// server closing an idle connection just as the client reuses it does.
type idleCloser struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool
	served int
}

func newIdleCloser(t *testing.T) *idleCloser {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &idleCloser{ln: ln, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *idleCloser) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *idleCloser) serve(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, 1<<20))
		req.Body.Close()
		if i > 0 {
			return // the reused connection: closed, unanswered
		}
		body := "data: {\"choices\":[{\"text\":\"hi\"}]}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n" +
			"data: [DONE]\n\n"
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Kvroute-Endpoint: e0\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
			return
		}
		s.mu.Lock()
		s.served++
		s.mu.Unlock()
	}
}

func (s *idleCloser) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// TestKeepAliveRace: over a server that closes every kept-alive connection
// as it is reused, a bench client's requests all succeed — each one after
// the first resent once on a new connection, and counted so.
func TestKeepAliveRace(t *testing.T) {
	s := newIdleCloser(t)
	c := NewClient("http://" + s.ln.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 6
	outs := make([]Outcome, 0, n)
	for i := range n {
		o := c.Completions(ctx, map[string]any{"model": "m", "prompt": fmt.Sprintf("request %d", i), "max_tokens": 1})
		if o.Err != nil {
			t.Fatalf("request %d failed: %v", i, o.Err)
		}
		if o.PromptTokens != 3 || o.Status != http.StatusOK {
			t.Fatalf("request %d: %+v", i, o)
		}
		outs = append(outs, o)
	}
	r := summarize(outs, []string{"e0"}, time.Second, 1)
	// The first request opens the connection; every later one reuses it,
	// loses the race and is resent.
	if r.Errors != 0 || r.ReuseRetries != n-1 {
		t.Fatalf("errors %d, reuse retries %d; want 0 and %d", r.Errors, r.ReuseRetries, n-1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.served != n {
		t.Fatalf("server answered %d requests, want %d", s.served, n)
	}
}

// TestBrokenReuse: only a reused connection that broke before any answer
// byte is resent; one that answered, or a new one, is the request's error.
func TestBrokenReuse(t *testing.T) {
	ctx := context.Background()
	for _, err := range []error{io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, syscall.ECONNRESET, syscall.EPIPE, errors.New("http: server closed idle connection")} {
		if !brokenConn(ctx, fmt.Errorf("Post: %w", err)) {
			t.Errorf("%v: not a broken connection", err)
		}
	}
	if brokenConn(ctx, context.DeadlineExceeded) || brokenConn(ctx, errors.New("x509: unknown authority")) {
		t.Error("a timeout or a TLS failure counts as a broken connection")
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if brokenConn(gone, io.EOF) {
		t.Error("a request whose context ended counts as a broken connection")
	}
}
