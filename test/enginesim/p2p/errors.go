package p2p

import (
	"errors"
	"fmt"
)

// The ways a pull fails; every one degrades the request to a local
// recompute (a MISS), as vLLM's P2P tier does. Reason names them for
// metrics.
var (
	// ErrUnreachable: the peer could not be dialed (refused, no route,
	// dial timeout) or this node has too many connections to open one.
	ErrUnreachable = errors.New("p2p: peer unreachable")
	// ErrRejected: the peer refused the connection (a fingerprint
	// mismatch, a duplicate connection, too many connections), or this
	// node refused the peer: its answer to our connect (a mismatch, an
	// identity other than the address dialled) or a bad frame on the
	// connection (malformed, out of place, a count past what was asked).
	ErrRejected = errors.New("p2p: connection rejected")
	// ErrHandshake: the connection was not ready within the handshake
	// timeout, or the handshake was malformed.
	ErrHandshake = errors.New("p2p: handshake failed")
	// ErrTimeout: the pull did not finish within the pull timeout (or its
	// caller gave up).
	ErrTimeout = errors.New("p2p: pull timed out")
	// ErrPeerDown: the connection died or the peer disconnected.
	ErrPeerDown = errors.New("p2p: peer connection lost")
	// ErrClosed: this node is shutting down.
	ErrClosed = errors.New("p2p: node closed")
)

// Reason names a pull error's kind: unreachable, rejected, handshake,
// timeout, peer_down, closed, or other.
func Reason(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{{ErrUnreachable, "unreachable"}, {ErrRejected, "rejected"}, {ErrHandshake, "handshake"},
		{ErrTimeout, "timeout"}, {ErrPeerDown, "peer_down"}, {ErrClosed, "closed"}} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}

// Reasons are every value Reason returns.
var Reasons = []string{"unreachable", "rejected", "handshake", "timeout", "peer_down", "closed", "other"}

// wrap is kind with what happened.
func wrap(kind error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", kind, fmt.Sprintf(format, args...))
}
