package lab

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/picker/peers"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/workload"
)

// LLMDCalibrated is the lab's second llm-d run: llm-d's "sticky until
// saturated" with its load gate calibrated on the lab's engines by llm-d's
// own recipe (peer-policies.md §1.2 "Calibration"; Calibrate), where
// llm-d (default) keeps the guide's 15,928 tokens a second measured on
// H100s. Reports compare kvroute against the stronger of the two.
const LLMDCalibrated = "llm-d-calibrated"

// Calibration is llm-d's recipe run on a fleet: the probes' TTFTs and the
// peak prefill throughput they give.
type Calibration struct {
	ChunkTokens           int   `json:"chunk_tokens"`
	TTFTms                []Num `json:"ttft_ms"` // the measured probes', in order
	PeakPrefillThroughput Num   `json:"peak_prefill_throughput"`
	MaxTTFTPenaltyS       Num   `json:"max_ttft_penalty_s"`
	TauTokens             Num   `json:"tau_tokens"`
}

// probes is the recipe's workload: warm-up then measured requests, one
// at a time, each a streaming completion of exactly chunk random token
// ids asking for one token — every one a cache miss.
type probes struct {
	fleet workload.Fleet
	chunk int
}

func (p probes) Name() string          { return "llm-d calibration" }
func (p probes) Fleet() workload.Fleet { return p.fleet }
func (p probes) SLO() time.Duration    { return time.Second }
func (p probes) Plan(o workload.Options) (workload.Plan, error) {
	return workload.Plan{Sessions: []workload.Planned{{Session: &probeSession{chunk: p.chunk, rng: rand.New(rand.NewPCG(o.Seed, 0x63616c))}}}}, nil
}

type probeSession struct {
	chunk, sent int
	rng         *rand.Rand
}

func (s *probeSession) Next(prev *workload.Answer) (workload.Request, time.Duration, bool) {
	if (prev != nil && !prev.OK) || s.sent == peers.CalibrationWarmup+peers.CalibrationRequests {
		return workload.Request{}, 0, true
	}
	s.sent++
	b := make([]byte, 0, 8*s.chunk+128)
	b = append(b, `{"model":"Qwen/Qwen3-0.6B","prompt":[`...)
	for i := 0; i < s.chunk; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(1000+s.rng.IntN(150_000)), 10)
	}
	b = append(b, `],"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`...)
	return workload.Request{Path: "/v1/completions", Body: b, Conversation: s.sent, Turn: 1}, 0, false
}

// Calibrate runs llm-d's recipe on a fresh fleet of cfg's engines for
// scenario sc (routed by llm-d, as the recipe sends through the router):
// CHUNK is the engines' max_num_batched_tokens, at most their context
// length less one; peak = CHUNK ÷ the median TTFT of the measured probes.
func Calibrate(cfg Config, sc workload.Scenario) (Calibration, error) {
	ecfg, err := engineConfig(cfg.Profile, cmpOr(cfg.GPUBlocks, sc.Fleet().GPUBlocks), cmpOr(cfg.MaxModelLen, sc.Fleet().MaxModelLen))
	if err != nil {
		return Calibration{}, err
	}
	chunk := min(ecfg.MaxNumBatchedTokens, ecfg.MaxModelLen-2)
	f := sc.Fleet()
	f.Engines = cmpOr(cfg.Engines, f.Engines)
	cfg.Policy = score.LLMD
	outs, err := Run(cfg, probes{fleet: f, chunk: chunk}, workload.Options{Seed: 1, Rate: 1})
	if err != nil {
		return Calibration{}, fmt.Errorf("llm-d calibration: %w", err)
	}
	if len(outs) != peers.CalibrationWarmup+peers.CalibrationRequests {
		return Calibration{}, fmt.Errorf("llm-d calibration: %d of %d probes answered", len(outs), peers.CalibrationWarmup+peers.CalibrationRequests)
	}
	c := Calibration{ChunkTokens: chunk, MaxTTFTPenaltyS: Num(peers.CalibrationTMax.Seconds())}
	var ttfts []time.Duration
	for _, o := range outs[peers.CalibrationWarmup:] {
		if !o.OK() {
			return Calibration{}, fmt.Errorf("llm-d calibration: a probe failed with %d", o.Status)
		}
		ttfts = append(ttfts, o.TTFT)
		c.TTFTms = append(c.TTFTms, Num(float64(o.TTFT)/float64(time.Millisecond)))
	}
	peak := peers.CalibratedPeak(chunk, ttfts)
	if peak <= 0 {
		return Calibration{}, fmt.Errorf("llm-d calibration: no peak from %v", ttfts)
	}
	c.PeakPrefillThroughput, c.TauTokens = Num(peak), Num(peak*peers.CalibrationTMax.Seconds())
	return c, nil
}
