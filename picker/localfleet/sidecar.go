package localfleet

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/sidecar/index"
)

// Update is one summary update as a sidecar streams it to the pickers,
// as a value: a snapshot or a delta of one endpoint's summary in one tier,
// of an epoch. Exactly one of Snapshot and Delta is set. Updates are
// never modified after they are made, so one update may be handed to
// several fleets (pickers).
type Update struct {
	Endpoint string
	Tier     tier.Tier
	Epoch    uint64
	Snapshot *summary.Snapshot
	Delta    *summary.Delta
	// Oldest is when the earliest batch behind a delta was applied (the
	// now given to Sidecar.Apply); zero when none was. A fleet records
	// the delay from it to the delta's arrival as the endpoint's
	// event-to-routable lag.
	Oldest time.Time
}

// Sidecar is one engine's in-process sidecar: the sidecar's own index
// core (sidecar/index, with the counting summaries of internal/summary)
// fed the engine's KV event batches in order, and the updates it streams
// from them — a snapshot of a tier the first time it is sent in an epoch,
// then numbered deltas — as sidecar/endpoint.go takes them. It is not
// safe for concurrent use: a Fleet serialises the sidecars it owns; a
// caller that shares one between fleets (the lab: one sidecar, several
// pickers) drives it from one goroutine.
type Sidecar struct {
	id     fleet.Identity
	idx    *index.Index
	fed    [tier.Count]bool // the tier's summary went out (snapshot) in this epoch
	oldest time.Time        // the earliest batch applied since the last Take
}

// NewSidecar returns the sidecar of the engine id describes, its
// summaries of params. It configures the index as the sidecar does for
// that engine: id.Model, id.BlockSize (required: the in-process engine
// knows it), params. It completes id as the sidecar advertises it: the key
// format (blockkey.FormatV1; another is an error), the summary
// parameters (params; others are an error), and the epoch (id.Epoch, or
// 1 when zero).
func NewSidecar(id fleet.Identity, params summary.Params) (*Sidecar, error) {
	if id.Endpoint == "" {
		return nil, errors.New("localfleet: an endpoint without a URL")
	}
	if id.BlockSize <= 0 {
		return nil, fmt.Errorf("localfleet: %s: block size %d: want > 0", id.Endpoint, id.BlockSize)
	}
	switch id.KeyFormat {
	case "":
		id.KeyFormat = blockkey.FormatV1
	case blockkey.FormatV1:
	default:
		return nil, fmt.Errorf("localfleet: %s: key format %q: the index keys %s", id.Endpoint, id.KeyFormat, blockkey.FormatV1)
	}
	switch id.SummaryParams {
	case "":
		id.SummaryParams = params.String()
	case params.String():
	default:
		return nil, fmt.Errorf("localfleet: %s: summary parameters %s: the sidecar's are %s", id.Endpoint, id.SummaryParams, params)
	}
	if id.Epoch == 0 {
		id.Epoch = 1
	}
	cfg := index.DefaultConfig()
	cfg.Model, cfg.Params = id.Model, params
	cfg.BlockSize, cfg.LearnBlockSize = id.BlockSize, false
	idx, err := index.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("localfleet: %s: %w", id.Endpoint, err)
	}
	return &Sidecar{id: id, idx: idx}, nil
}

// Identity returns the endpoint as the sidecar advertises it, with its
// current epoch.
func (s *Sidecar) Identity() fleet.Identity { return s.id }

// Epoch returns the current epoch: it starts at the identity's and moves
// on at every AllBlocksCleared and Restart.
func (s *Sidecar) Epoch() uint64 { return s.id.Epoch }

// Stats returns the index's counters (events indexed, dropped and why).
func (s *Sidecar) Stats() index.Stats { return s.idx.Stats() }

// Apply indexes one batch of the engine's KV events, applied at now, in
// the order the engine published them. Batches must come in order and
// complete: an in-process producer delivers them so, and the live
// stream's gaps, duplicates, replays and restarts (sidecar/sequence) are
// not modelled. An AllBlocksCleared event clears the index and starts a
// new epoch, as the sidecar's sequencer does: the next Take sends every
// tier's summary as a snapshot of that epoch. The error joins those of
// the events the index could not key (an unknown parent, a run that does
// not validate); each such event is dropped, as the sidecar drops it, and
// the rest of the batch is applied.
func (s *Sidecar) Apply(b *kvevents.Batch, now time.Time) error {
	var errs []error
	for i := range b.Events {
		ev := &b.Events[i]
		if err := s.idx.Apply(ev); err != nil {
			errs = append(errs, err)
		}
		if ev.Type == kvevents.TypeAllBlocksCleared {
			s.newEpoch()
		}
	}
	if s.oldest.IsZero() || now.Before(s.oldest) {
		s.oldest = now
	}
	return errors.Join(errs...)
}

// Restart clears the index for a new engine process and starts a new
// epoch, as the sidecar does when it sees the engine restart.
func (s *Sidecar) Restart() {
	s.idx.Clear()
	s.newEpoch()
}

func (s *Sidecar) newEpoch() {
	s.id.Epoch++
	s.fed = [tier.Count]bool{}
}

// Take returns the updates since the last Take, in tier order, as the
// sidecar's delta tick takes them (sidecar/endpoint.go takeDeltas): for
// each tier with a summary, a snapshot when the tier has not been sent in
// this epoch, then a delta when bits flipped. None when nothing changed.
func (s *Sidecar) Take() []Update {
	var out []Update
	oldest := s.oldest
	s.oldest = time.Time{}
	for _, t := range s.idx.Tiers() {
		sum := s.idx.Summary(t)
		if !s.fed[t] {
			out = append(out, s.snapshot(t))
			s.fed[t] = true
		}
		if d, ok := sum.TakeDelta(); ok {
			out = append(out, Update{Endpoint: s.id.Endpoint, Tier: t, Epoch: s.id.Epoch, Delta: &d, Oldest: oldest})
		}
	}
	return out
}

// Snapshots returns every tier's summary as a snapshot at its last delta:
// what the sidecar sends a picker that starts watching it (or resumes from
// a position it cannot continue), after which that picker takes the
// deltas of later Takes. It changes nothing.
func (s *Sidecar) Snapshots() []Update {
	var out []Update
	for _, t := range s.idx.Tiers() {
		out = append(out, s.snapshot(t))
	}
	return out
}

func (s *Sidecar) snapshot(t tier.Tier) Update {
	snap := s.idx.Summary(t).Snapshot()
	return Update{Endpoint: s.id.Endpoint, Tier: t, Epoch: s.id.Epoch, Snapshot: &snap}
}
