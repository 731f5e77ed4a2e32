package p2p

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// protocolVersion is the side channel's version, in every connect message.
const protocolVersion = 1

// digestSize is a block digest's length.
const digestSize = len(blockkey.Digest{})

// The message types (the frame's "type").
const (
	typeConnect      = "connect"
	typeConnectAck   = "connect_ack"
	typeDisconnect   = "disconnect"
	typeLookup       = "lookup"
	typeLookupResp   = "lookup_resp"
	typeFetch        = "fetch"
	typeTransferDone = "transfer_done"
)

// frame is one message: a 4-byte big-endian length, then that many bytes
// of one JSON object. Fields are used by the types that name them.
type frame struct {
	Type string `json:"type"`
	// Seq correlates a request (lookup, fetch) with its answer
	// (lookup_resp, transfer_done); the sender chooses it.
	Seq uint64 `json:"seq,omitempty"`
	// Version, ID and Fingerprint are connect's and connect_ack's: the
	// sender's protocol version, identity (host:port, as it is dialed)
	// and fingerprint.
	Version     int          `json:"version,omitempty"`
	ID          string       `json:"id,omitempty"`
	Fingerprint *Fingerprint `json:"fingerprint,omitempty"`
	// KVRequestID is lookup's and fetch's kv_request_id (the consumer's).
	KVRequestID string `json:"kv_request_id,omitempty"`
	// Hashes are lookup's and fetch's block digests, concatenated (base64
	// in JSON), in prefix order.
	Hashes []byte `json:"hashes,omitempty"`
	// Hits is lookup_resp's answer: how many leading hashes the source's
	// CPU tier holds. Active is the pulls the source is serving.
	Hits   int `json:"hits,omitempty"`
	Active int `json:"active,omitempty"`
	// HoldMS is fetch's transfer time in wall milliseconds: the source
	// counts the pull as active (sharing its link) that long.
	HoldMS int64 `json:"hold_ms,omitempty"`
	// Success and Blocks are transfer_done's: whether every block asked
	// for was there, and how many leading ones were.
	Success bool `json:"success,omitempty"`
	Blocks  int  `json:"blocks,omitempty"`
	// Reason is disconnect's: why the sender is closing.
	Reason string `json:"reason,omitempty"`
}

// Frame errors, as the rejected-frame counter's reasons.
var (
	errOversized = errors.New("oversized")
	errMalformed = errors.New("malformed")
)

// frameError is a peer's bad frame: its reason (errOversized,
// errMalformed) and what was wrong.
type frameError struct {
	reason error
	detail string
}

func (e *frameError) Error() string { return e.reason.Error() + " frame: " + e.detail }
func (e *frameError) Unwrap() error { return e.reason }

func malformed(format string, args ...any) error {
	return &frameError{reason: errMalformed, detail: fmt.Sprintf(format, args...)}
}

// readFrame reads one frame's body, at most max bytes; a longer or empty
// frame is an error before its body is read.
func readFrame(r io.Reader, max int) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n == 0 {
		return nil, malformed("empty")
	}
	if uint64(n) > uint64(max) {
		return nil, &frameError{reason: errOversized, detail: fmt.Sprintf("%d bytes, at most %d", n, max)}
	}
	// Read as it arrives: a peer announcing a large frame and sending
	// little of it holds no more memory than it sent.
	body, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err != nil {
		return nil, err
	}
	if len(body) < int(n) {
		return nil, io.ErrUnexpectedEOF
	}
	return body, nil
}

// decodeFrame parses and checks one frame's body: a known type, the
// fields its type needs, every bound (maxHashes digests, string lengths,
// non-negative counts, hits and blocks of at most maxHashes: no message
// asks about more). Active is not bounded here: the consumer clamps it.
func decodeFrame(body []byte, maxHashes int) (frame, error) {
	var f frame
	if err := json.Unmarshal(body, &f); err != nil {
		return frame{}, malformed("%v", err)
	}
	if len(f.ID) > maxString || len(f.KVRequestID) > maxString || len(f.Reason) > maxString {
		return frame{}, malformed("a string over %d bytes", maxString)
	}
	if f.Hits < 0 || f.Active < 0 || f.HoldMS < 0 || f.Blocks < 0 {
		return frame{}, malformed("a negative count")
	}
	if f.Hits > maxHashes || f.Blocks > maxHashes {
		return frame{}, malformed("%d hits, %d blocks: at most %d", f.Hits, f.Blocks, maxHashes)
	}
	switch f.Type {
	case typeConnect, typeConnectAck:
		if f.ID == "" || f.Fingerprint == nil {
			return frame{}, malformed("%s without id or fingerprint", f.Type)
		}
		if err := f.Fingerprint.validate(); err != nil {
			return frame{}, malformed("%s: %v", f.Type, err)
		}
	case typeLookup, typeFetch:
		if len(f.Hashes) == 0 || len(f.Hashes)%digestSize != 0 {
			return frame{}, malformed("%s with %d hash bytes (want a positive multiple of %d)", f.Type, len(f.Hashes), digestSize)
		}
		if len(f.Hashes)/digestSize > maxHashes {
			return frame{}, malformed("%s with %d hashes, at most %d", f.Type, len(f.Hashes)/digestSize, maxHashes)
		}
	case typeLookupResp, typeTransferDone, typeDisconnect:
	default:
		return frame{}, malformed("unknown type %.64q", f.Type)
	}
	return f, nil
}

// encodeFrame is a frame on the wire: its length, then its JSON.
func encodeFrame(f frame) ([]byte, error) {
	body, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 4, 4+len(body))
	binary.BigEndian.PutUint32(out, uint32(len(body)))
	return append(out, body...), nil
}

// packHashes concatenates digests for a frame.
func packHashes(hs []blockkey.Digest) []byte {
	out := make([]byte, 0, len(hs)*digestSize)
	for i := range hs {
		out = append(out, hs[i][:]...)
	}
	return out
}

// unpackHashes splits a checked frame's hashes (a multiple of digestSize).
func unpackHashes(b []byte) []blockkey.Digest {
	out := make([]blockkey.Digest, len(b)/digestSize)
	for i := range out {
		copy(out[i][:], b[i*digestSize:])
	}
	return out
}
