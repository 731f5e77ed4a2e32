package p2p

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// session is one connection to a peer, either direction: once ready, both
// sides send lookups and fetches over it and answer the other's.
type session struct {
	n        *Node
	peer     string // the peer's identity (host:port), its key in the node's sessions
	outbound bool
	host     string // an inbound session's remote address (its per-host count)
	// established is set, under the node's lock, once an outbound
	// session's handshake completed and it is still the one registered:
	// a pending one may be superseded by the peer's own connection.
	established bool

	conn  net.Conn      // set before ready closes
	ready chan struct{} // closed once the handshake completed
	done  chan struct{} // closed when the session ends
	once  sync.Once
	err   error // why it ended; set before done closes

	ctx    context.Context // the answers' context: ends with the session
	cancel context.CancelFunc

	wmu sync.Mutex // one writer at a time

	mu      sync.Mutex
	seq     uint64
	pending map[uint64]waiter

	fetched  atomic.Bool   // a fetch went over it, either way
	sem      chan struct{} // the peer's requests being answered
	handlers sync.WaitGroup
}

// waiter is a request's answer slot: the type expected and where it goes.
type waiter struct {
	want string
	ch   chan frame
}

func newSession(n *Node, peer string, outbound bool) *session {
	ctx, cancel := context.WithCancel(n.ctx)
	return &session{n: n, peer: peer, outbound: outbound, ready: make(chan struct{}), done: make(chan struct{}),
		ctx: ctx, cancel: cancel, pending: map[uint64]waiter{}, sem: make(chan struct{}, n.cfg.MaxInflight)}
}

// fail ends the session with err (the first call wins) and closes its
// connection; requests waiting on it get err.
func (s *session) fail(err error) {
	s.once.Do(func() {
		s.err = err
		close(s.done)
		s.cancel()
		s.mu.Lock()
		conn := s.conn
		s.mu.Unlock()
		if conn != nil {
			_ = conn.Close()
		}
	})
}

// attach gives the session its connection; false (and the connection
// closed) when the session has already ended.
func (s *session) attach(conn net.Conn) bool {
	s.mu.Lock()
	s.conn = conn
	s.mu.Unlock()
	select {
	case <-s.done: // fail may have run before conn was set
		_ = conn.Close()
		return false
	default:
		return true
	}
}

// await waits for the session to be ready.
func (s *session) await(ctx context.Context) (*session, error) {
	select {
	case <-s.ready:
		return s, nil
	case <-s.done:
		return nil, s.err
	case <-ctx.Done():
		return nil, wrap(ErrTimeout, "waiting for the connection to %s: %v", s.peer, ctx.Err())
	}
}

// send writes one frame, bounded by the pull timeout; a failed write ends
// the session.
func (s *session) send(f frame) error {
	b, err := encodeFrame(f)
	if err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(s.n.cfg.PullTimeout))
	if _, err := s.conn.Write(b); err != nil {
		s.fail(wrap(ErrPeerDown, "writing to %s: %v", s.peer, err))
		return s.err
	}
	return nil
}

// call sends a request and waits for its answer of type want.
func (s *session) call(ctx context.Context, f frame, want string) (frame, error) {
	ch := make(chan frame, 1)
	s.mu.Lock()
	s.seq++
	f.Seq = s.seq
	s.pending[f.Seq] = waiter{want: want, ch: ch}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pending, f.Seq)
		s.mu.Unlock()
	}()
	if err := s.send(f); err != nil {
		return frame{}, err
	}
	select {
	case r := <-ch:
		return r, nil
	case <-s.done:
		return frame{}, s.err
	case <-ctx.Done():
		return frame{}, wrap(ErrTimeout, "%s to %s: %v", f.Type, s.peer, ctx.Err())
	}
}

// run reads the peer's frames until the session ends, answering its
// requests and delivering its answers; then it waits for the answers
// under way.
func (s *session) run() {
	defer s.handlers.Wait()
	for {
		body, err := readFrame(s.conn, s.n.cfg.MaxFrameBytes)
		if err != nil {
			s.readFailed(err)
			return
		}
		f, err := decodeFrame(body, s.n.cfg.MaxHashes)
		if err != nil {
			s.reject(err)
			return
		}
		switch f.Type {
		case typeLookup, typeFetch:
			select {
			case s.sem <- struct{}{}:
			case <-s.done:
				return
			}
			select {
			case s.n.answering <- struct{}{}:
			default: // the node answers as many as it may: a miss, now
				s.busy(f)
				<-s.sem
				continue
			}
			s.handlers.Add(1)
			go s.answer(f)
		case typeLookupResp, typeTransferDone:
			if !s.deliver(f) {
				return
			}
		case typeDisconnect:
			s.n.logOnce(s.peer, "p2p peer disconnected", zap.String("peer", s.peer), zap.String("reason", f.Reason))
			s.fail(wrap(ErrPeerDown, "%s disconnected: %.200s", s.peer, f.Reason))
			return
		default: // connect, connect_ack: the handshake is over
			s.reject(&frameError{reason: errUnexpected, detail: f.Type + " after the handshake"})
			return
		}
	}
}

// errUnexpected is a well-formed frame out of place.
var errUnexpected = errors.New("unexpected")

// readFailed ends the session on a read error: the peer closed, the node
// closed, or a bad frame.
func (s *session) readFailed(err error) {
	var fe *frameError
	switch {
	case errors.As(err, &fe):
		s.reject(err)
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		s.fail(wrap(ErrPeerDown, "%s closed the connection", s.peer))
	default:
		s.fail(wrap(ErrPeerDown, "reading from %s: %v", s.peer, err))
	}
}

// reject counts and logs a peer's bad frame, tells the peer and ends the
// session.
func (s *session) reject(err error) {
	reason := s.n.countRejected(err)
	s.n.logOnce(s.peer, "p2p peer sent a bad frame; closing the connection", zap.String("peer", s.peer), zap.Error(err))
	s.sayGoodbye("protocol error: " + reason)
	s.fail(wrap(ErrRejected, "%s sent a bad frame: %v", s.peer, err))
}

// countRejected counts a peer's bad frame by its reason and returns it.
func (n *Node) countRejected(err error) string {
	reason := "malformed"
	switch {
	case errors.Is(err, errOversized):
		reason = "oversized"
	case errors.Is(err, errUnexpected):
		reason = "unexpected"
	}
	n.m.framesRejected.WithLabelValues(reason).Inc()
	return reason
}

// sayGoodbye sends a disconnect, best effort, without waiting long.
func (s *session) sayGoodbye(reason string) {
	b, err := encodeFrame(frame{Type: typeDisconnect, Reason: reason})
	if err != nil || !s.wmu.TryLock() {
		return
	}
	defer s.wmu.Unlock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = s.conn.Write(b)
}

// deliver hands an answer to its request; an answer of the wrong type
// ends the session (false). One nobody waits for (its caller gave up) is
// dropped.
func (s *session) deliver(f frame) bool {
	s.mu.Lock()
	w, ok := s.pending[f.Seq]
	if ok && w.want == f.Type {
		delete(s.pending, f.Seq) // a second answer to it is dropped
	}
	s.mu.Unlock()
	if !ok {
		return true
	}
	if w.want != f.Type {
		s.reject(&frameError{reason: errUnexpected, detail: f.Type + " answering a " + w.want + "'s request"})
		return false
	}
	w.ch <- f // buffered, one answer per seq
	return true
}

// busy answers a request past the node's MaxAnswering as a miss, at
// once, and counts it.
func (s *session) busy(f frame) {
	s.n.m.framesRejected.WithLabelValues("busy").Inc()
	s.n.logOnce("busy", "p2p side channel: too many requests being answered; answering more as misses",
		zap.String("peer", s.peer), zap.Int("max_answering", s.n.cfg.MaxAnswering))
	if f.Type == typeLookup {
		_ = s.send(frame{Type: typeLookupResp, Seq: f.Seq, Active: s.n.serving.count()})
		return
	}
	_ = s.send(frame{Type: typeTransferDone, Seq: f.Seq})
}

// answer serves one of the peer's requests from the local CPU tier. It
// holds a node-wide answering slot for the lookup only: a peer that does
// not read its answers stalls its own connection, not the node.
func (s *session) answer(f frame) {
	defer func() {
		<-s.sem
		s.handlers.Done()
	}()
	hashes := unpackHashes(f.Hashes)
	hits, err := s.n.lookup(s.ctx, hashes)
	<-s.n.answering
	if s.ctx.Err() != nil {
		return // the session or the node is closing: no answer
	}
	if err != nil || hits < 0 {
		hits = 0
	}
	hits = min(hits, len(hashes))
	s.n.m.served.WithLabelValues(f.Type).Inc()
	if f.Type == typeLookup {
		_ = s.send(frame{Type: typeLookupResp, Seq: f.Seq, Hits: hits, Active: s.n.serving.count()})
		return
	}
	hold := s.n.cfg.PullTimeout // HoldMS is the peer's: bounded before it is a Duration
	if f.HoldMS < hold.Milliseconds() {
		hold = time.Duration(f.HoldMS) * time.Millisecond
	}
	if hits > 0 {
		s.n.serving.add(hold)
	}
	s.fetched.Store(true)
	_ = s.send(frame{Type: typeTransferDone, Seq: f.Seq, Success: err == nil && hits == len(hashes), Blocks: hits})
}
