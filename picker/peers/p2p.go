package peers

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/tier"
)

// P2PSourceConfig is llm-d's p2p-source-producer's parameter
// (shared/docs/peer-policies.md §4, kv-transfer.md §4).
type P2PSourceConfig struct {
	// MinCachedTokenDelta is how many more leading prompt tokens the
	// sampled source must hold than the computing endpoint for the source
	// to be named; at least 1. The producer's own default is 1; each arm
	// sets its guide's value in its Default*Config (2048 for the
	// gpt-oss-120b RDMA guide's arms, 1 for remaining-work routing), and a
	// run may set the crossover measured on its engines
	// (CalibratedMinCachedTokenDelta).
	MinCachedTokenDelta int
}

// DefaultP2PSourceConfig is the producer's default (minCachedTokenDelta 1).
func DefaultP2PSourceConfig() P2PSourceConfig { return P2PSourceConfig{MinCachedTokenDelta: 1} }

// Validate refuses a MinCachedTokenDelta below 1, as the producer does.
func (c P2PSourceConfig) Validate() error {
	if c.MinCachedTokenDelta < 1 {
		return fmt.Errorf("p2p-source-producer MinCachedTokenDelta %d: want at least 1", c.MinCachedTokenDelta)
	}
	return nil
}

// P2PEndpoint is one endpoint as llm-d's p2p-source-producer reads its
// prefix match: P2PPerTier and P2PTierless make them from the two kinds
// of data.
type P2PEndpoint struct {
	ID string
	// Source is the leading prompt tokens a pull could take from it: with
	// per-tier data its CPU-tier run only (a source serves its CPU tier),
	// with tierless data all it matched.
	Source int
	// Local is the leading prompt tokens it holds on any tier: its cached
	// count as the computing endpoint (local blocks need no pull, whatever
	// their tier).
	Local int
	// BlockSize is its match data's block size in tokens: a source within
	// one block of the best is a candidate.
	BlockSize int
	// Waiting is its engine's vllm:num_requests_waiting as last scraped.
	Waiting float64
}

// P2PPerTier is the producer's view of the healthy candidates from
// per-tier data, Candidate.Matched in blocks of blockSize tokens: Source
// the CPU-tier run, Local the longest tier's run (max over tiers), in
// tokens. Unhealthy candidates are left out (no source, and they do not
// set the best).
func P2PPerTier(cands []Candidate, blockSize int) []P2PEndpoint {
	b := max(0, blockSize)
	var out []P2PEndpoint
	for _, c := range cands {
		if !c.Healthy {
			continue
		}
		local := 0
		for _, t := range tier.All() {
			local = max(local, c.Matched[t])
		}
		out = append(out, P2PEndpoint{ID: c.ID, Source: max(0, c.Matched[tier.CPU]) * b, Local: local * b, BlockSize: b, Waiting: c.Waiting})
	}
	return out
}

// P2PTierless is the producer's view of the healthy candidates from
// tierless data: matched[ID] leading blocks of blockSize tokens, used as
// is for both the source and the computing side (llm-d's approximate
// producer, which models no tiers).
func P2PTierless(cands []Candidate, matched map[string]int, blockSize int) []P2PEndpoint {
	b := max(0, blockSize)
	var out []P2PEndpoint
	for _, c := range cands {
		if !c.Healthy {
			continue
		}
		n := max(0, matched[c.ID]) * b
		out = append(out, P2PEndpoint{ID: c.ID, Source: n, Local: n, BlockSize: b, Waiting: c.Waiting})
	}
	return out
}

// P2PSpread is the producer's sampling coordinate for a request:
// FNV-32a(requestID)/2^32, in [0, 1), the same for the same id.
func P2PSpread(requestID string) float64 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(requestID)) // never fails
	return float64(h.Sum32()) / (1 << 32)
}

// P2PSample is the producer's Produce step, before placement: among eps
// with Source > 0, those within one block of the best (Source +
// BlockSize ≥ max Source) are candidates; one is sampled with weight
// 1/(1 + waiting) at coordinate P2PSpread(requestID), walking them in
// eps's order (the last one if rounding runs past the end). Its index in
// eps, or -1 when no endpoint holds anything. A waiting count that is
// negative or not a number counts as 0.
func P2PSample(requestID string, eps []P2PEndpoint) int {
	best := 0
	for _, e := range eps {
		best = max(best, e.Source)
	}
	if best <= 0 {
		return -1
	}
	var idx []int
	var weights []float64
	total := 0.0
	for i, e := range eps {
		if e.Source <= 0 || e.Source+e.BlockSize < best {
			continue
		}
		waiting := e.Waiting
		if !(waiting > 0) {
			waiting = 0
		}
		w := 1 / (1 + waiting)
		idx, weights, total = append(idx, i), append(weights, w), total+w
	}
	target := P2PSpread(requestID) * total
	for k, w := range weights {
		if target < w {
			return idx[k]
		}
		target -= w
	}
	return idx[len(idx)-1]
}

// Name is the producer's PreRequest step, after placement: the sampled
// source (an index into eps, -1 none) is named iff it is not the
// computing endpoint and its Source exceeds the computing endpoint's
// Local by at least MinCachedTokenDelta (a computing endpoint missing
// from eps holds 0). Its ID, or "".
func (c P2PSourceConfig) Name(eps []P2PEndpoint, sampled int, computing string) string {
	if sampled < 0 || sampled >= len(eps) || eps[sampled].ID == computing {
		return ""
	}
	local := 0
	for _, e := range eps {
		if e.ID == computing {
			local = e.Local
			break
		}
	}
	if eps[sampled].Source-local < c.MinCachedTokenDelta {
		return ""
	}
	return eps[sampled].ID
}

// p2pRule is an arm's source rule: the producer at its threshold.
type p2pRule struct{ source P2PSourceConfig }

// MinCachedTokenDelta is the arm's threshold, in tokens.
func (r *p2pRule) MinCachedTokenDelta() int { return r.source.MinCachedTokenDelta }

// SetMinCachedTokenDelta sets the arm's threshold for the rest of the
// run (the crossover measured on the run's engines, say); the placement's
// state is kept; an invalid value changes nothing.
func (r *p2pRule) SetMinCachedTokenDelta(n int) error {
	c := P2PSourceConfig{MinCachedTokenDelta: n}
	if err := c.Validate(); err != nil {
		return err
	}
	r.source = c
	return nil
}

// name runs the rule over eps (made before placement) for ch's choice.
func (r *p2pRule) name(requestID string, eps []P2PEndpoint, cands []Candidate, ch *Choice) {
	if ch.Index < 0 {
		return
	}
	ch.Source = r.source.Name(eps, P2PSample(requestID, eps), cands[ch.Index].ID)
}

// llm-d's ladder for minCachedTokenDelta (calibrate-min-cached-token-
// delta.sh, shared/docs/peer-policies.md §4): a warmed pair of engines; at
// each length, P2PCalibrationReps times, a fresh random prefix of that
// many tokens is seeded on the source and sent to the consumer without
// the pull (recompute, the control) and another with it (pull); the
// medians are compared. P2PCalibrationLengths are the lengths kvroute's
// lab runs (2K, 8K, 16K, 32K and 48K tokens; the script's own default is
// 2048 to 32768, doubling), shortest first.
func P2PCalibrationLengths() []int { return []int{2048, 8192, 16384, 32768, 49152} }

// P2PCalibrationReps is the script's repetitions per length.
const P2PCalibrationReps = 5

// P2PProbe is one length's measurements, per repetition: the consumer's
// request time without the pull and with it, and the bytes each leg moved
// into the consumer's GPU from its offload tier (the control must move
// none; a pull that moved none did not fire).
type P2PProbe struct {
	Tokens                    int
	Recompute, Pull           []time.Duration
	RecomputeBytes, PullBytes []float64
}

// The ladder's failures, as the script reports them.
var (
	ErrP2PNoPull       = errors.New("no pull ever fired: every probe moved zero bytes into the consumer")
	ErrP2PContaminated = errors.New("run discarded: a no-pull control moved bytes, so the pulls' bytes are not the peer's")
	ErrP2PNoCrossover  = errors.New("no crossover in the tested range: the pull fired but never beat recompute")
)

// CalibratedMinCachedTokenDelta is the script's verdict on the probes:
// the smallest length whose median pull time is below its median
// recompute time and whose pulls moved bytes (median above 0). An error
// when no length's pulls moved bytes, when any control moved bytes, or
// when no length won. Pure: the caller runs the probes.
func CalibratedMinCachedTokenDelta(probes []P2PProbe) (int, error) {
	engaged, contaminated, crossover := false, false, 0
	for _, p := range probes {
		for _, b := range p.RecomputeBytes {
			contaminated = contaminated || b > 0
		}
		moved := medianFloat(p.PullBytes) > 0
		engaged = engaged || moved
		if moved && len(p.Pull) > 0 && len(p.Recompute) > 0 && MedianDuration(p.Pull) < MedianDuration(p.Recompute) &&
			p.Tokens > 0 && (crossover == 0 || p.Tokens < crossover) {
			crossover = p.Tokens
		}
	}
	switch {
	case !engaged:
		return 0, ErrP2PNoPull
	case contaminated:
		return 0, ErrP2PContaminated
	case crossover == 0:
		return 0, ErrP2PNoCrossover
	}
	return crossover, nil
}

// medianFloat is the median of v (the two middle values' mean for an
// even count); 0 for none; NaN counts as 0.
func medianFloat(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := make([]float64, len(v))
	for i, x := range v {
		if !math.IsNaN(x) {
			s[i] = x
		}
	}
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
