package p2p

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// LookupFunc answers a peer's lookup or fetch from the local CPU tier:
// how many leading hashes it holds now. It must return when ctx ends (the
// session or the node closing); an error counts as no hit.
type LookupFunc func(ctx context.Context, hashes []blockkey.Digest) (hits int, err error)

// Node is one engine rank's side channel: it listens for peers, answers
// their lookups and fetches through a LookupFunc, and pulls from peers. It
// keeps one connection per peer, reused both ways. Safe for concurrent
// use.
type Node struct {
	cfg    Config
	log    *zap.Logger
	lookup LookupFunc
	m      *metrics
	ln     net.Listener
	id     string

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection's goroutine

	mu       sync.Mutex
	closed   bool
	sessions map[string]*session // by peer identity, pending or ready
	perHost  map[string]int      // inbound sessions registered, by remote address
	warned   map[string]bool     // peers already logged at warn

	serving, receiving holds // the pulls under way from and to here

	handshakes chan struct{} // inbound connections not yet admitted
	answering  chan struct{} // peers' requests being answered, node-wide
}

// maxHandshakes bounds the inbound connections in their handshake; more
// are closed at once (counted as failed).
const maxHandshakes = 64

// maxWarned bounds the peers remembered for logging once.
const maxWarned = 4096

// New validates cfg, listens on cfg.Host:cfg.Port and starts serving.
// lookup answers peers; log and reg take the node's logs and metrics.
func New(cfg Config, lookup LookupFunc, log *zap.Logger, reg prometheus.Registerer) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if lookup == nil || log == nil || reg == nil {
		return nil, errors.New("p2p: New needs a lookup function, a logger and a registerer")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("p2p side channel: %w", err)
	}
	port := cfg.Port
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		port = a.Port
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{cfg: cfg, log: log, lookup: lookup, m: newMetrics(reg, cfg.Labels), ln: ln, id: identity(cfg.Host, port),
		ctx: ctx, cancel: cancel, sessions: map[string]*session{}, perHost: map[string]int{}, warned: map[string]bool{},
		handshakes: make(chan struct{}, maxHandshakes), answering: make(chan struct{}, cfg.MaxAnswering)}
	n.wg.Add(1)
	go n.accept()
	return n, nil
}

// ID is the node's identity, host:port, as peers dial it.
func (n *Node) ID() string { return n.id }

// Close stops serving, ends every connection (telling peers) and waits
// for the node's goroutines.
func (n *Node) Close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	open := make([]*session, 0, len(n.sessions))
	for _, s := range n.sessions {
		open = append(open, s)
	}
	n.mu.Unlock()
	_ = n.ln.Close()
	for _, s := range open {
		select {
		case <-s.ready:
			s.sayGoodbye("shutting down")
		default:
		}
		s.fail(ErrClosed)
	}
	n.cancel()
	n.wg.Wait()
}

// accept takes inbound connections until the node closes.
func (n *Node) accept() {
	defer n.wg.Done()
	for {
		conn, err := n.ln.Accept()
		if err != nil {
			if n.ctx.Err() != nil {
				return
			}
			n.log.Warn("p2p side channel: accept", zap.Error(err))
			select { // a passing error (out of descriptors): back off a little
			case <-time.After(50 * time.Millisecond):
			case <-n.ctx.Done():
				return
			}
			continue
		}
		select {
		case n.handshakes <- struct{}{}:
		default: // too many half-open connections
			n.m.connections.WithLabelValues("inbound", "failed").Inc()
			n.logOnce("handshakes", "p2p side channel: too many connections in their handshake; closing new ones")
			_ = conn.Close()
			continue
		}
		n.wg.Add(1)
		go n.inbound(conn)
	}
}

// inbound runs an accepted connection: the peer's connect, our checks,
// our connect_ack, then the session.
func (n *Node) inbound(conn net.Conn) {
	defer n.wg.Done()
	remote := conn.RemoteAddr().String()
	_ = conn.SetDeadline(time.Now().Add(n.cfg.HandshakeTimeout))
	f, err := n.readHandshake(conn, typeConnect)
	<-n.handshakes
	if err != nil {
		var fe *frameError
		if errors.As(err, &fe) {
			n.countRejected(err)
		}
		n.m.connections.WithLabelValues("inbound", "failed").Inc()
		n.logOnce(hostOf(remote), "p2p inbound handshake failed", zap.String("remote", remote), zap.Error(err))
		_ = conn.Close()
		return
	}
	s, reason := n.admit(f, hostOf(remote))
	if s == nil {
		if reason == reasonCrossed {
			n.m.connections.WithLabelValues("inbound", "crossed").Inc()
			n.log.Debug("p2p dials crossed; keeping ours", zap.String("peer", f.ID))
		} else {
			n.m.connections.WithLabelValues("inbound", "rejected").Inc()
			n.logOnce(f.ID, "p2p rejecting peer", zap.String("peer", f.ID), zap.String("remote", remote), zap.String("reason", reason))
		}
		writeBestEffort(conn, frame{Type: typeDisconnect, Reason: reason})
		_ = conn.Close()
		return
	}
	if !s.attach(conn) { // the node closed meanwhile
		n.remove(s)
		return
	}
	fp := n.cfg.Fingerprint
	if err := s.send(frame{Type: typeConnectAck, Version: protocolVersion, ID: n.id, Fingerprint: &fp}); err != nil {
		n.m.connections.WithLabelValues("inbound", "failed").Inc()
		n.remove(s)
		return
	}
	_ = conn.SetDeadline(time.Time{})
	n.m.connections.WithLabelValues("inbound", "ready").Inc()
	n.serve(s)
}

// acceptable says why a peer's connect (or connect_ack) is refused: its
// protocol version or its fingerprint; "" when it is acceptable. A frame
// without a fingerprint is refused, whatever let it through.
func acceptable(ours Fingerprint, f frame) string {
	switch {
	case f.Version != protocolVersion:
		return fmt.Sprintf("protocol version %d, want %d", f.Version, protocolVersion)
	case f.Fingerprint == nil:
		return "no fingerprint"
	}
	return ours.mismatch(*f.Fingerprint)
}

// admit checks a peer's connect, from remote address host, and registers
// its session; nil and why when it is refused.
func (n *Node) admit(f frame, host string) (*session, string) {
	if why := acceptable(n.cfg.Fingerprint, f); why != "" {
		return nil, why
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, "shutting down"
	}
	if n.perHost[host] >= n.cfg.MaxSessionsPerHost {
		n.mu.Unlock()
		return nil, fmt.Sprintf("too many connections from %s", host)
	}
	old := n.sessions[f.ID]
	switch {
	case old == nil:
		if len(n.sessions) >= n.cfg.MaxSessions {
			n.mu.Unlock()
			return nil, "too many connections"
		}
	case old.outbound && f.ID < n.id && !old.established:
		// Our dial and the peer's crossed: the lower identity's is kept,
		// here the peer's. Ours is dropped, its pulls wait for this one.
	case old.outbound && f.ID > n.id:
		n.mu.Unlock()
		return nil, reasonCrossed // ours is kept: the peer waits for it
	default:
		n.mu.Unlock()
		return nil, "duplicate connection from " + f.ID
	}
	s := newSession(n, f.ID, false)
	s.host = host
	n.sessions[f.ID] = s
	n.perHost[host]++
	n.mu.Unlock()
	if old != nil {
		n.m.connections.WithLabelValues("outbound", "crossed").Inc()
		n.log.Debug("p2p dials crossed; keeping the peer's", zap.String("peer", f.ID))
		old.fail(errSuperseded)
	}
	return s, ""
}

// reasonCrossed is the disconnect refusing a peer's connection because
// ours to it, dialled at the same time, is kept: the connection dialled by
// the lower identity (host:port, compared as strings) wins, so two nodes
// dialling each other at once end with one connection, both pulls over
// it.
const reasonCrossed = "crossed dials: keeping the lower identity's connection"

// errSuperseded ends a pending outbound session the peer's own connection
// replaced; its waiters take the replacement.
var errSuperseded = errors.New("p2p: superseded by the peer's connection")

// errCrossed is a refusal saying the peer keeps its own connection.
var errCrossed = errors.New("p2p: the peer keeps its own connection")

// serve runs a ready session until it ends, then forgets it.
func (n *Node) serve(s *session) {
	close(s.ready)
	n.m.sessions.Inc()
	s.run()
	n.m.sessions.Dec()
	n.remove(s)
}

// remove ends s and drops it from the sessions (if it is still the one
// registered for its peer).
func (n *Node) remove(s *session) {
	s.fail(wrap(ErrPeerDown, "connection to %s closed", s.peer))
	n.forget(s)
}

// forget drops s from the sessions if it is still the one registered for
// its peer: the next pull to the peer dials afresh.
func (n *Node) forget(s *session) {
	n.mu.Lock()
	if n.sessions[s.peer] == s {
		delete(n.sessions, s.peer)
		if !s.outbound {
			if n.perHost[s.host]--; n.perHost[s.host] <= 0 {
				delete(n.perHost, s.host)
			}
		}
	}
	n.mu.Unlock()
}

// readHandshake reads the peer's first frame, which must be of type want
// (see handshakeFrame).
func (n *Node) readHandshake(conn net.Conn, want string) (frame, error) {
	body, err := readFrame(conn, n.cfg.MaxFrameBytes)
	if err != nil {
		return frame{}, err
	}
	f, err := decodeFrame(body, n.cfg.MaxHashes)
	if err != nil {
		return frame{}, err
	}
	return f, handshakeFrame(f, want)
}

// handshakeFrame checks a decoded first frame: a connect opening an
// inbound connection; a connect_ack, or a disconnect refusing us,
// answering our connect. Anything else (a disconnect in place of a
// connect included) is a failed handshake.
func handshakeFrame(f frame, want string) error {
	if f.Type == want || (want == typeConnectAck && f.Type == typeDisconnect) {
		return nil
	}
	return malformed("%s during the handshake, want %s", f.Type, want)
}

// writeBestEffort writes one frame to a connection about to close.
func writeBestEffort(conn net.Conn, f frame) {
	if b, err := encodeFrame(f); err == nil {
		_ = conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = conn.Write(b)
	}
}

// logOnce logs at warn the first time for key (a peer), at debug after.
func (n *Node) logOnce(key, msg string, fields ...zap.Field) {
	n.mu.Lock()
	first := !n.warned[key] && len(n.warned) < maxWarned
	if first {
		n.warned[key] = true
	}
	n.mu.Unlock()
	if first {
		n.log.Warn(msg, fields...)
	} else {
		n.log.Debug(msg, fields...)
	}
}

func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// holds counts pulls under way: each until its end, in wall time.
type holds struct {
	mu    sync.Mutex
	until []time.Time
}

// maxHolds bounds the pulls remembered (the oldest are forgotten).
const maxHolds = 1 << 16

func (h *holds) add(d time.Duration) {
	if d <= 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.prune(time.Now())
	if len(h.until) >= maxHolds {
		h.until = h.until[1:]
	}
	h.until = append(h.until, time.Now().Add(d))
}

func (h *holds) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.prune(time.Now())
	return len(h.until)
}

func (h *holds) prune(now time.Time) {
	kept := h.until[:0]
	for _, t := range h.until {
		if t.After(now) {
			kept = append(kept, t)
		}
	}
	h.until = kept
}
