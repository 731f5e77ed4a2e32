package fleet

import (
	"time"

	"github.com/kvroute/kvroute/internal/identity"
)

// Identity is one endpoint as its sidecar describes it: what keys,
// summaries and tokens depend on, and where to find the sidecar's debug
// pages. It is kvroute's own copy of what the summary stream carries, so
// routing never sees protobuf types.
type Identity struct {
	Endpoint             string // the engine's base URL
	Rank                 int    // data-parallel rank
	Model                string // the served model name
	BlockSize            int    // the engine's KV block size; 0 while unknown
	NumGPUBlocks         int
	HashAlgo             string
	KeyFormat            string
	SummaryParams        string
	TokenizerFingerprint string
	Epoch                uint64
	Partial              bool   // the sidecar lost events it could not replay
	DebugURL             string // the sidecar's debug HTTP base URL; "" unknown
}

// Group is the identity group the endpoint belongs to: endpoints of
// different groups are never compared.
func (id Identity) Group() string {
	return identity.Group{Model: id.Model, BlockSize: id.BlockSize, KeyFormat: id.KeyFormat,
		SummaryParams: id.SummaryParams, TokenizerFingerprint: id.TokenizerFingerprint}.ID()
}

// Load is an engine's load as its sidecar last scraped it.
type Load struct {
	Waiting      float64 // requests waiting
	Running      float64 // requests running
	KVCacheUsage float64 // 0..1
}

// Endpoint is one engine rank as the fleet state knows it: a value,
// copied out of the state, safe to keep.
type Endpoint struct {
	URL     string
	Sidecar string // the sidecar's gRPC address
	Group   string
	Info    Identity
	// Load is the last load report; LoadAt is when it arrived (this
	// process's clock), zero while none has.
	Load   Load
	LoadAt time.Time
	// LastUpdate is when anything (delta, snapshot, load report) last
	// arrived for the endpoint; zero while nothing has.
	LastUpdate time.Time
}

// HasLoad reports whether a load report has arrived.
func (e *Endpoint) HasLoad() bool { return !e.LoadAt.IsZero() }

// Refused is an endpoint a sidecar offered that the state did not take.
type Refused struct {
	Info    Identity
	Sidecar string
	Reason  string // ReasonSummaryParams, ReasonGroupFull or ReasonOtherOwner
}
