package p2p

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// PullResult is what one pull found and moved.
type PullResult struct {
	// Hits is how many leading hashes the source's CPU tier held at the
	// lookup; Blocks how many of them it still held at the fetch (a block
	// evicted in between is a miss). Blocks ≤ Hits.
	Hits, Blocks int
	// SrcActive is the pulls the source was serving at the lookup,
	// DstActive the pulls this node was receiving: the pull shares both
	// ends' links with them.
	SrcActive, DstActive int
	// First is whether this was the pair's first fetch over its
	// connection (it pays the connection's setup).
	First bool
}

// HoldFunc returns a pull's transfer time in wall time, from what its
// lookup found: the source counts the pull as serving, and this node as
// receiving, that long.
type HoldFunc func(hits, srcActive, dstActive int, first bool) time.Duration

// Pull pulls the leading hashes peer (host:port) holds: a lookup, then,
// when it hit, a fetch of the hits. No KV moves (the simulation has none):
// the transfer time is the caller's, computed from the result. The whole
// pull is bounded by the pull timeout; any failure is an error whose
// Reason names it, and the caller recomputes (vLLM's MISS).
func (n *Node) Pull(ctx context.Context, peer, kvRequestID string, hashes []blockkey.Digest, hold HoldFunc) (PullResult, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.PullTimeout)
	defer cancel()
	s, err := n.session(ctx, peer)
	if err != nil {
		return PullResult{}, err
	}
	var res PullResult
	if res.Hits, res.SrcActive, err = n.probe(ctx, s, typeLookup, kvRequestID, hashes, 0); err != nil || res.Hits == 0 {
		return res, err
	}
	res.DstActive, res.First = n.receiving.count(), !s.fetched.Load()
	d := max(hold(res.Hits, res.SrcActive, res.DstActive, res.First), 0)
	res.Blocks, _, err = n.probe(ctx, s, typeFetch, kvRequestID, hashes[:res.Hits], d)
	s.fetched.Store(true)
	if res.Blocks > 0 {
		n.receiving.add(d)
	}
	return res, err
}

// MaxActive bounds the pulls a source may report it is serving: a node
// remembers at most this many (and a default node answers at most
// MaxSessions × MaxInflight requests at once, the same 65536). A larger
// report is taken as MaxActive, so the share of a link stays finite.
const MaxActive = maxHolds

// probe sends lookups (or fetches, carrying hold) of hashes in messages of
// at most MaxHashes, until one comes back short: the leading hits and the
// largest active count reported (at most MaxActive). An answer claiming
// more hits (or blocks) than its message asked about ends the session:
// the pull fails as rejected and the frame is counted.
func (n *Node) probe(ctx context.Context, s *session, op, kvRequestID string, hashes []blockkey.Digest, hold time.Duration) (hits, active int, err error) {
	want := typeLookupResp
	if op == typeFetch {
		want = typeTransferDone
	}
	for off := 0; off < len(hashes); off += n.cfg.MaxHashes {
		chunk := hashes[off:min(off+n.cfg.MaxHashes, len(hashes))]
		r, err := s.call(ctx, frame{Type: op, KVRequestID: kvRequestID, Hashes: packHashes(chunk), HoldMS: ceilMS(hold)}, want)
		if err != nil {
			return hits, active, err
		}
		got := r.Hits // a lookup_resp's answer; a transfer_done's is Blocks
		if op == typeFetch {
			got = r.Blocks
		}
		if got < 0 || got > len(chunk) {
			err := &frameError{reason: errMalformed, detail: fmt.Sprintf("%s answering %d hashes with %d", r.Type, len(chunk), got)}
			s.reject(err)
			return hits, active, wrap(ErrRejected, "%s: %v", s.peer, err)
		}
		if r.Active > MaxActive {
			n.logOnce(s.peer, "p2p peer reports more pulls under way than a node can; taken as the bound",
				zap.String("peer", s.peer), zap.Int("active", r.Active), zap.Int("bound", MaxActive))
		}
		hits, active = hits+got, max(active, min(r.Active, MaxActive))
		if got < len(chunk) {
			break
		}
	}
	return hits, active, nil
}

// session returns the ready connection to peer, dialing it when there is
// none (concurrent callers share one dial). A pending dial the peer's own
// connection superseded (crossed dials) hands its callers over to that
// connection.
func (n *Node) session(ctx context.Context, peer string) (*session, error) {
	if _, _, err := net.SplitHostPort(peer); err != nil {
		return nil, wrap(ErrUnreachable, "peer %q: %v", peer, err)
	}
	for {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return nil, ErrClosed
		}
		s := n.sessions[peer]
		if s == nil {
			if len(n.sessions) >= n.cfg.MaxSessions {
				n.mu.Unlock()
				return nil, wrap(ErrUnreachable, "too many connections to dial %s", peer)
			}
			s = newSession(n, peer, true)
			n.sessions[peer] = s
			n.wg.Add(1)
			go n.dial(s)
		}
		n.mu.Unlock()
		r, err := s.await(ctx)
		if !errors.Is(err, errSuperseded) {
			return r, err
		}
	}
}

// dial connects an outbound session: the connection, our connect, the
// peer's connect_ack, each within the handshake timeout; then it runs the
// session. A dial the peer refused because its own, crossing ours, is
// kept waits (within the handshake timeout) for that connection to
// supersede it.
func (n *Node) dial(s *session) {
	defer n.wg.Done()
	conn, err := n.connect(s)
	if err != nil && errors.Is(err, errCrossed) && s.peer < n.id {
		if conn != nil {
			_ = conn.Close()
		}
		t := time.NewTimer(n.cfg.HandshakeTimeout)
		select {
		case <-s.done: // superseded, or the node closed
			err = s.err
		case <-t.C:
			err = wrap(ErrRejected, "%s kept its own connection, which did not arrive within %v", s.peer, n.cfg.HandshakeTimeout)
		}
		t.Stop()
	}
	if superseded(s) {
		if conn != nil {
			_ = conn.Close()
		}
		return
	}
	if err != nil {
		outcome := "failed"
		if Reason(err) == "rejected" {
			outcome = "rejected"
		}
		n.m.connections.WithLabelValues("outbound", outcome).Inc()
		n.logOnce(s.peer, "p2p connection to peer failed; its pulls recompute", zap.String("peer", s.peer), zap.Error(err))
		n.forget(s) // before its waiters learn: a pull after theirs dials afresh
		s.fail(err)
		return
	}
	n.mu.Lock()
	current := n.sessions[s.peer] == s
	s.established = current
	n.mu.Unlock()
	if !current { // superseded (or removed) as the handshake ended
		s.fail(errSuperseded)
		return
	}
	_ = conn.SetDeadline(time.Time{})
	n.m.connections.WithLabelValues("outbound", "ready").Inc()
	n.serve(s)
}

// superseded reports whether s ended because the peer's connection
// replaced it.
func superseded(s *session) bool {
	select {
	case <-s.done:
		return errors.Is(s.err, errSuperseded)
	default:
		return false
	}
}

// connect dials s.peer and runs our side of the handshake.
func (n *Node) connect(s *session) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.peer)
	if err != nil {
		if n.ctx.Err() != nil {
			return nil, ErrClosed
		}
		return nil, wrap(ErrUnreachable, "dialing %s: %v", s.peer, err)
	}
	if !s.attach(conn) { // closed while dialing
		return nil, s.err
	}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	fp := n.cfg.Fingerprint
	b, err := encodeFrame(frame{Type: typeConnect, Version: protocolVersion, ID: n.id, Fingerprint: &fp})
	if err == nil {
		_, err = conn.Write(b)
	}
	if err != nil {
		return nil, wrap(ErrHandshake, "sending connect to %s: %v", s.peer, err)
	}
	return conn, n.checkAck(conn, s.peer)
}

// checkAck reads the peer's answer to our connect.
func (n *Node) checkAck(conn net.Conn, peer string) error {
	f, err := n.readHandshake(conn, typeConnectAck)
	switch {
	case err != nil:
		return wrap(ErrHandshake, "from %s: %v", peer, err)
	case f.Type == typeDisconnect && f.Reason == reasonCrossed:
		return fmt.Errorf("%w: %w: %s", ErrRejected, errCrossed, peer)
	case f.Type == typeDisconnect:
		return wrap(ErrRejected, "%s refused: %.200s", peer, f.Reason)
	}
	why := acceptable(n.cfg.Fingerprint, f)
	if why == "" && f.ID != peer {
		// Sessions are keyed by identity, and a dial knows only the
		// address it dials: the two must be one.
		why = fmt.Sprintf("the peer dialled at %s answers as %.200q: its side channel's host must be the address peers dial it at", peer, f.ID)
	}
	if why != "" {
		writeBestEffort(conn, frame{Type: typeDisconnect, Reason: why})
		return wrap(ErrRejected, "%s: %s", peer, why)
	}
	return nil
}

// ceilMS is d in whole milliseconds, rounded up.
func ceilMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
