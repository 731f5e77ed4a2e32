package p2p

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Fingerprint is what two peers must agree on before either serves the
// other (vLLM checks the offload block length and the hash seed at connect,
// and the parallel layout as part of the connection's fingerprint; the
// simulated engine has no tensor parallelism, so the model stands in for
// the layout). A mismatch rejects the connection; the consumer's requests
// recompute.
type Fingerprint struct {
	// BlockSize is the offload block in tokens (kv_connector_extra_config
	// block_size; vLLM's block_len).
	BlockSize int `json:"block_size"`
	// HashSeed is the NONE_HASH seed (PYTHONHASHSEED, or vLLM's default).
	HashSeed string `json:"hash_seed"`
	// HashAlgo is --prefix-caching-hash-algo.
	HashAlgo string `json:"hash_algo"`
	// Model is the served model (--model).
	Model string `json:"model"`
}

// validate bounds a fingerprint, ours or a peer's.
func (f Fingerprint) validate() error {
	if f.BlockSize <= 0 {
		return fmt.Errorf("block size %d must be positive", f.BlockSize)
	}
	if len(f.HashSeed) > maxString || len(f.HashAlgo) > maxString || len(f.Model) > maxString {
		return fmt.Errorf("fingerprint strings over %d bytes", maxString)
	}
	return nil
}

// mismatch says how a peer's fingerprint differs from ours; "" when they
// agree.
func (f Fingerprint) mismatch(peer Fingerprint) string {
	switch {
	case f.BlockSize != peer.BlockSize:
		return fmt.Sprintf("block_len mismatch: offload block %d tokens here, %d at the peer", f.BlockSize, peer.BlockSize)
	case f.HashSeed != peer.HashSeed:
		return "hash seed mismatch (PYTHONHASHSEED differs)"
	case f.HashAlgo != peer.HashAlgo:
		return fmt.Sprintf("hash algorithm mismatch: %s here, %s at the peer", f.HashAlgo, peer.HashAlgo)
	case f.Model != peer.Model:
		return fmt.Sprintf("model mismatch: %q here, %q at the peer", f.Model, peer.Model)
	}
	return ""
}

// Config configures a Node.
type Config struct {
	// Host is the side channel's bind address and the identity peers dial
	// back, used verbatim, as vLLM uses the P2P tier's host
	// (VLLM_P2P_SIDE_CHANNEL_HOST, default localhost).
	Host string
	// Port is the bound port: the tier's base port plus the data-parallel
	// index (VLLM_P2P_SIDE_CHANNEL_PORT, default 5710). 0 binds an
	// ephemeral port (tests); the identity then carries the port bound.
	Port int
	// Fingerprint is this engine's identity, checked against every peer's.
	Fingerprint Fingerprint
	// HandshakeTimeout bounds a connection's dial and handshake: one not
	// ready within it is dead (VLLM_P2P_HANDSHAKE_TIMEOUT_S).
	HandshakeTimeout time.Duration
	// PullTimeout bounds one pull, lookup and fetch (vLLM's fetch load
	// timeout, 30 s); it also bounds a write to a peer.
	PullTimeout time.Duration
	// MaxHashes bounds the hashes of one lookup or fetch message; a longer
	// prefix is probed in several messages.
	MaxHashes int
	// MaxFrameBytes bounds one frame; a peer that sends more is cut off.
	MaxFrameBytes int
	// MaxInflight bounds the requests of one peer served at once; its
	// further messages wait (the connection is not read meanwhile).
	MaxInflight int
	// MaxSessions bounds the connections, inbound and outbound; an inbound
	// one past it is refused.
	MaxSessions int
	// MaxSessionsPerHost bounds the inbound connections from one remote
	// address (loopback included): identities are self-asserted, so one
	// client could otherwise take every session. One past it is refused
	// (connections_total{inbound,rejected}).
	MaxSessionsPerHost int
	// MaxAnswering bounds the peers' lookups and fetches being answered
	// at once, across every connection (each connection's own bound is
	// MaxInflight). One arriving past it is not queued: it is answered at
	// once as a miss (no hit, no block; the consumer recomputes) and
	// counted (frames_rejected_total{reason="busy"}).
	MaxAnswering int
	// Labels are constant labels on the node's metrics (the engine's
	// model_name and engine).
	Labels prometheus.Labels
}

// DefaultPort is vLLM's VLLM_P2P_SIDE_CHANNEL_PORT default.
const DefaultPort = 5710

// DefaultHost is vLLM's VLLM_P2P_SIDE_CHANNEL_HOST default.
const DefaultHost = "localhost"

// maxString bounds every string field a peer sends.
const maxString = 1024

// DefaultConfig returns vLLM's defaults (localhost:5710) and the bounds.
func DefaultConfig() Config {
	return Config{
		Host:               DefaultHost,
		Port:               DefaultPort,
		HandshakeTimeout:   10 * time.Second,
		PullTimeout:        30 * time.Second,
		MaxHashes:          16384,
		MaxFrameBytes:      1 << 20,
		MaxInflight:        64,
		MaxSessions:        1024,
		MaxSessionsPerHost: 64,
		MaxAnswering:       256,
	}
}

// Validate checks c.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("p2p: "+format, args...))
		}
	}
	check(c.Host != "" && len(c.Host) <= 253, "host %q: want a host name or address", c.Host)
	check(c.Port >= 0 && c.Port <= 65535, "port %d out of range", c.Port)
	check(c.HandshakeTimeout > 0, "handshake timeout %v must be positive", c.HandshakeTimeout)
	check(c.PullTimeout > 0, "pull timeout %v must be positive", c.PullTimeout)
	check(c.MaxHashes > 0, "max hashes %d must be positive", c.MaxHashes)
	// A full message of MaxHashes digests, base64 in JSON, must fit a frame.
	check(c.MaxFrameBytes >= 4096+c.MaxHashes*digestSize*4/3, "max frame %d bytes cannot carry %d hashes", c.MaxFrameBytes, c.MaxHashes)
	check(c.MaxInflight > 0 && c.MaxSessions > 0, "max in flight %d and max sessions %d must be positive", c.MaxInflight, c.MaxSessions)
	check(c.MaxSessionsPerHost > 0 && c.MaxAnswering > 0, "max sessions per host %d and max answering %d must be positive", c.MaxSessionsPerHost, c.MaxAnswering)
	if err := c.Fingerprint.validate(); err != nil {
		errs = append(errs, fmt.Errorf("p2p: %w", err))
	}
	return errors.Join(errs...)
}

// identity is host:port as peers name this node.
func identity(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}
