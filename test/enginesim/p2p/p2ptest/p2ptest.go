package p2ptest

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/test/enginesim/p2p"
)

// Reply answers one request a consumer sent (op is "lookup" or "fetch",
// hashes the digests it carried): the answer's fields ("type" included;
// "seq" is the request's, set by the source), or nil for no answer.
type Reply func(op string, hashes int) map[string]any

// Source is a scripted source: it acknowledges any connect with its
// identity and fingerprint, then answers each request with its Reply.
type Source struct {
	// ID is its identity, the address it listens on (host:port).
	ID string

	ln    net.Listener
	reply Reply
	fp    p2p.Fingerprint
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
	as    string // the identity it answers with; ID when ""
}

// AnswerAs makes the source answer later connects as id, not as the
// address it listens on.
func (s *Source) AnswerAs(id string) {
	s.mu.Lock()
	s.as = id
	s.mu.Unlock()
}

// maxFrame bounds a frame the source reads.
const maxFrame = 1 << 22

// NewSource listens on a free port of 127.0.0.1 and serves until the test
// ends.
func NewSource(t testing.TB, fp p2p.Fingerprint, reply Reply) *Source {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Source{ID: ln.Addr().String(), ln: ln, reply: reply, fp: fp, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *Source) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Source) accept() {
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

// request is what the source reads of a consumer's frame.
type request struct {
	Type   string `json:"type"`
	Seq    uint64 `json:"seq"`
	Hashes []byte `json:"hashes"`
}

func (s *Source) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() { _ = c.Close() }()
	var hello request
	if read(c, &hello) != nil || hello.Type != "connect" {
		return
	}
	s.mu.Lock()
	id := cmp.Or(s.as, s.ID)
	s.mu.Unlock()
	if write(c, map[string]any{"type": "connect_ack", "version": 1, "id": id, "fingerprint": s.fp}) != nil {
		return
	}
	for {
		var r request
		if read(c, &r) != nil {
			return
		}
		if r.Type != "lookup" && r.Type != "fetch" {
			continue
		}
		ans := s.reply(r.Type, len(r.Hashes)/32)
		if ans == nil {
			continue
		}
		ans["seq"] = r.Seq
		if write(c, ans) != nil {
			return
		}
	}
}

func read(c net.Conn, into any) error {
	var head [4]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n == 0 || n > maxFrame {
		return io.ErrUnexpectedEOF
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return err
	}
	return json.Unmarshal(body, into)
}

func write(c net.Conn, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...))
	return err
}
