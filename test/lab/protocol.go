package lab

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/lab/stats"
	"github.com/kvroute/kvroute/test/workload"
)

// ClaimSeeds is the first seed claims may use: defaults are tuned on
// seeds 1–10 only, and every claim is made on seeds from 101 up.
const ClaimSeeds = 101

// Sweep is a comparison: policies × seeds × offered rates of one
// scenario, each run on a fresh fleet.
type Sweep struct {
	Scenario workload.Scenario
	// Policies are routing policy names (score.ParsePolicy, and the
	// lab's own: llm-d-calibrated, llm-d-calibrated+p2p, precise-no-pull,
	// and the arms at the ladder's threshold, llm-d-precise+p2p-calibrated,
	// llm-d+p2p-calibrated, llm-d-load+p2p-calibrated), in report order.
	Policies []string
	Seeds    []uint64
	// Rates are multiples of the scenario's nominal arrival rate
	// (default [1]).
	Rates []float64
	// SLO is the TTFT objective of goodput (p90 ≤ SLO); 0: the
	// scenario's.
	SLO time.Duration
	// Fleet is the fleet, pickers and delays (its Policy is each run's).
	Fleet Config
	// Workers bounds the runs at once (default GOMAXPROCS): runs are
	// independent, so their results do not depend on it.
	Workers int
	// Progress, when set, is told after each run (from any goroutine).
	Progress func(done, total int)
}

// RunResult is one run's figures.
type RunResult struct {
	Policy  string  `json:"policy"`
	Seed    uint64  `json:"seed"`
	Rate    float64 `json:"rate"`
	Figures Figures `json:"figures"`
}

// CI is a mean with its 95% interval over seeds (N of them).
type CI struct {
	Mean Num `json:"mean"`
	Lo   Num `json:"lo"`
	Hi   Num `json:"hi"`
	N    int `json:"n"`
}

func ciOf(iv stats.Interval) CI {
	return CI{Mean: Num(iv.Mean), Lo: Num(iv.Lo), Hi: Num(iv.Hi), N: iv.N}
}

// Summary is a policy's figures at one rate over the seeds.
type Summary struct {
	Policy         string  `json:"policy"`
	Rate           float64 `json:"rate"`
	HitRate        CI      `json:"hit_rate"`
	TTFTMean       CI      `json:"ttft_mean_ms"`
	TTFTP50        CI      `json:"ttft_p50_ms"`
	TTFTP90        CI      `json:"ttft_p90_ms"`
	TTFTP99        CI      `json:"ttft_p99_ms"`
	CompletedShare CI      `json:"completed_share"`
	// WarmReturnRate, LoadImbalance and LoadCV are Figures' (a seed
	// without continuations has no warm-return rate, and is left out).
	WarmReturnRate CI  `json:"warm_return_rate"`
	LoadImbalance  CI  `json:"load_imbalance"`
	LoadCV         CI  `json:"load_cv"`
	Refused429     int `json:"refused_429"`
	Failed         int `json:"failed"`
	// Tiers, when any run touched a tier: the shares of the prompt
	// tokens by where their KV came from, and the pulls.
	Tiers *TierSummary `json:"tiers,omitempty"`
}

// TierSummary is Tiers over the seeds: the shares' means with their
// intervals, and the counts summed.
type TierSummary struct {
	GPUHit         CI  `json:"gpu_hit_share"`
	CPUHit         CI  `json:"cpu_hit_share"`
	Pulled         CI  `json:"pulled_share"`
	Recomputed     CI  `json:"recomputed_share"`
	PulledGB       CI  `json:"pulled_gb"`
	MaxSourceShare CI  `json:"max_source_share"`
	SourcesNamed   int `json:"sources_named"`
	Pulls          int `json:"pulls"`
	MissedPulls    int `json:"missed_pulls"`
	FailedWithPull int `json:"failed_with_source"`
}

// Ratio is a policy's paired ratio to the best peer on one figure: per
// seed, its value ÷ the best peer's on that seed; the mean with a
// bootstrap 95% interval.
type Ratio struct {
	Policy  string  `json:"policy"`
	Figure  string  `json:"figure"`
	Rate    float64 `json:"rate"`
	Ratio   CI      `json:"ratio"`
	PerSeed []Num   `json:"per_seed"`
}

// Goodput is a policy's goodput over the seeds: per seed the highest
// offered rate (a multiple of the nominal) meeting the SLO with ≥ 99%
// completed, 0 when none does.
type Goodput struct {
	Policy  string `json:"policy"`
	Goodput CI     `json:"goodput"`
	PerSeed []Num  `json:"per_seed"`
}

// Results is a sweep's results.json: the inputs, every run, and the
// comparisons. It holds no wall-clock time, so the same inputs give the
// same bytes.
type Results struct {
	Scenario  string `json:"scenario"`
	Engines   int    `json:"engines"`
	GPUBlocks int    `json:"gpu_blocks"`
	Pickers   int    `json:"pickers"`
	Profile   string `json:"profile"`
	// EnginePriority: the engines ran vLLM's priority policy and
	// kvroute's pickers --engine-priority (Config.EnginePriority).
	EnginePriority bool       `json:"engine_priority,omitempty"`
	Delays         delaysJSON `json:"delays_ms"`
	Policies       []string   `json:"policies"`
	Peers          []string   `json:"peers"`
	Seeds          []uint64   `json:"seeds"`
	// ClaimSeeds: every seed is ≥ 101, so the figures may back a claim.
	ClaimSeeds bool        `json:"claim_seeds"`
	Rates      []float64   `json:"rates"`
	SLOms      Num         `json:"slo_ms"`
	Runs       []RunResult `json:"runs"`
	Summary    []Summary   `json:"summary"`
	VsBestPeer []Ratio     `json:"vs_best_peer,omitempty"`
	// GivenTokens: the scenario sends /v1/responses, which upstream llm-d
	// cannot tokenize (it scores prefix 0 there); its llm-d-precise here
	// is handed kvroute's exact tokens, and is labelled so.
	GivenTokens bool `json:"given_tokens,omitempty"`
	// LLMDCalibration is llm-d's recipe run on the lab's engines, when
	// llm-d-calibrated ran.
	LLMDCalibration *Calibration `json:"llm_d_calibration,omitempty"`
	// P2PLadder is llm-d's minCachedTokenDelta ladder run on the sweep's
	// profile (RunLadder), when an arm ran at its threshold
	// (llm-d-precise+p2p-calibrated, llm-d+p2p-calibrated,
	// llm-d-load+p2p-calibrated): its table and the value those runs
	// used, min_cached_token_delta.
	P2PLadder *Ladder   `json:"p2p_ladder,omitempty"`
	Goodput   []Goodput `json:"goodput,omitempty"`
	// Tenants, when the scenario's requests have tenants: per policy and
	// rate, each step and tenant's figures, the median over the seeds
	// (each run's are its figures' tenants).
	Tenants []TenantSummary `json:"tenants,omitempty"`
	// ByPickers, when the sweep ran at several numbers of pickers
	// (RunByPickers), compares each with one picker; the rest of Results
	// is then the sweep at one picker.
	ByPickers *ByPickers `json:"by_pickers,omitempty"`
}

type delaysJSON struct {
	EventToIndex    Num `json:"event_to_index"`
	DeltaInterval   Num `json:"delta_interval"`
	SummaryToPicker Num `json:"summary_to_picker"`
	LoadPeriod      Num `json:"load_period"`
	Render          Num `json:"render"`
	Hop             Num `json:"hop"`
}

func delaysOf(d Delays) delaysJSON {
	ms := func(x time.Duration) Num { return Num(float64(x) / float64(time.Millisecond)) }
	return delaysJSON{ms(d.EventToIndex), ms(d.DeltaInterval), ms(d.SummaryToPicker), ms(d.LoadPeriod), ms(d.Render), ms(d.Hop)}
}

// Validate checks the sweep's inputs.
func (s Sweep) Validate() error {
	var errs []error
	if s.Scenario == nil {
		errs = append(errs, errors.New("lab: no scenario"))
	}
	if len(s.Policies) == 0 {
		errs = append(errs, errors.New("lab: no policy"))
	}
	for _, p := range s.Policies {
		if _, err := policyOf(p); err != nil {
			errs = append(errs, err)
		}
	}
	if len(s.Seeds) == 0 {
		errs = append(errs, errors.New("lab: no seed"))
	}
	for _, r := range s.Rates {
		if !(r > 0) || math.IsInf(r, 0) {
			errs = append(errs, fmt.Errorf("lab: rate %v: want a positive multiple of the nominal rate", r))
		}
	}
	fl := s.Fleet
	fl.Policy = score.Precise
	if err := fl.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// RunSweep runs every policy × rate × seed and compares them. Before
// the runs, once per sweep: llm-d's load-gate recipe (Calibrate) when
// llm-d-calibrated or llm-d-calibrated+p2p is among the policies, and
// llm-d's minCachedTokenDelta ladder (RunLadder, on the sweep's profile,
// seed 1) when an arm at the ladder's threshold is; each such run holds
// the arm's threshold at the ladder's value in every picker from its
// start (picker.Router.SetMinCachedTokenDelta), and results.json
// records the ladder (p2p_ladder). A recipe that finds no value fails
// the sweep.
func RunSweep(s Sweep) (*Results, error) {
	if len(s.Rates) == 0 {
		s.Rates = []float64{1}
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if s.SLO == 0 {
		s.SLO = s.Scenario.SLO()
	}
	var cal *Calibration
	if slices.Contains(s.Policies, LLMDCalibrated) || slices.Contains(s.Policies, LLMDCalibratedP2P) {
		c, err := Calibrate(s.Fleet, s.Scenario)
		if err != nil {
			return nil, err
		}
		cal = &c
	}
	var ladder *Ladder
	if slices.ContainsFunc(s.Policies, isCalibratedArm) {
		l, err := RunLadder(cmpOrString(s.Fleet.Profile, s.Scenario.Fleet().Profile), 1)
		if err != nil {
			return nil, err
		}
		ladder = &l
	}
	type job struct {
		policy string
		seed   uint64
		rate   float64
	}
	var jobs []job
	for _, p := range s.Policies {
		for _, r := range s.Rates {
			for _, seed := range s.Seeds {
				jobs = append(jobs, job{p, seed, r})
			}
		}
	}
	runs := make([]RunResult, len(jobs))
	errs := make([]error, len(jobs))
	workers := s.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for w := 0; w < min(workers, len(jobs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				cfg := s.Fleet
				cfg.Policy, _ = policyOf(j.policy)
				if j.policy == LLMDCalibrated || j.policy == LLMDCalibratedP2P {
					cfg.LLMDPeak = float64(cal.PeakPrefillThroughput)
				}
				if j.policy == PreciseNoPull {
					cfg.NoPulls = true
				}
				var watch func(*run)
				if isCalibratedArm(j.policy) {
					watch = withMinCachedTokenDelta(ladder.MinCachedTokenDelta)
				}
				outs, _, err := runWith(cfg, s.Scenario, workload.Options{Seed: j.seed, Rate: j.rate}, watch)
				if err != nil {
					errs[i] = fmt.Errorf("%s, seed %d, rate %v: %w", j.policy, j.seed, j.rate, err)
				} else {
					f := figuresOf(outs, engineURLs(cfg, s.Scenario))
					f.Tenants = tenantPhases(outs, phasesOf(s.Scenario))
					runs[i] = RunResult{Policy: j.policy, Seed: j.seed, Rate: j.rate, Figures: f}
				}
				if s.Progress != nil {
					mu.Lock()
					done++
					s.Progress(done, len(jobs))
					mu.Unlock()
				}
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res := compare(s, runs)
	res.LLMDCalibration, res.P2PLadder = cal, ladder
	return res, nil
}

// withMinCachedTokenDelta sets every picker's arm's source threshold to
// tokens before the run starts (picker.Router.SetMinCachedTokenDelta):
// the calibrated arms' runs.
func withMinCachedTokenDelta(tokens int) func(*run) {
	return func(r *run) {
		for _, p := range r.pickers {
			if err := p.router.SetMinCachedTokenDelta(tokens); err != nil {
				r.fail(err)
			}
		}
	}
}

// PreciseNoPull is kvroute's precise with its source decision off: the
// same placement model, every prefix it does not hold recomputed — the
// control that measures what its pulls are worth, as each peer arm's
// is its base.
const PreciseNoPull = "precise-no-pull"

// LLMDCalibratedP2P is llm-d+p2p with its load gate calibrated as
// llm-d-calibrated's (peer-policies.md §4: "default and calibrated").
const LLMDCalibratedP2P = "llm-d-calibrated+p2p"

// policyOf is the picker's policy a policy name runs: its own, llm-d for
// llm-d-calibrated (llm-d+p2p for its arm), precise for precise-no-pull,
// the arm for an arm at the ladder's threshold (…+p2p-calibrated).
func policyOf(name string) (score.Policy, error) {
	if p, ok := calibratedArms[name]; ok {
		return p, nil
	}
	switch name {
	case LLMDCalibrated:
		return score.LLMD, nil
	case LLMDCalibratedP2P:
		return score.LLMDP2P, nil
	case PreciseNoPull:
		return score.Precise, nil
	}
	return score.ParsePolicy(name)
}

// isPeer: name is a peer's policy (llm-d-calibrated, its arm and the
// arms at the ladder's threshold included).
func isPeer(name string) bool {
	return name == LLMDCalibrated || name == LLMDCalibratedP2P || isCalibratedArm(name) || score.Policy(name).IsPeer()
}

// engineURLs are the URLs of the fleet's engines, as build names them.
func engineURLs(cfg Config, sc workload.Scenario) []string {
	n := cfg.Engines
	if n == 0 {
		n = sc.Fleet().Engines
	}
	if cfg.EngineURLs != nil {
		return cfg.EngineURLs
	}
	out := make([]string, n)
	for i := range out {
		out[i] = engineURL(i)
	}
	return out
}

// compare summarises the runs: per policy and rate the figures' means
// with intervals; the paired ratios to the best peer; goodput.
func compare(s Sweep, runs []RunResult) *Results {
	f := s.Scenario.Fleet()
	res := &Results{Scenario: s.Scenario.Name(), Engines: cmpOr(s.Fleet.Engines, f.Engines), GPUBlocks: cmpOr(s.Fleet.GPUBlocks, f.GPUBlocks),
		Pickers: s.Fleet.Pickers, Profile: profileName(cmpOrString(s.Fleet.Profile, s.Scenario.Fleet().Profile)), Delays: delaysOf(s.Fleet.Delays), Policies: slices.Clone(s.Policies), Seeds: slices.Clone(s.Seeds),
		Rates: slices.Clone(s.Rates), SLOms: Num(float64(s.SLO) / float64(time.Millisecond)), Runs: runs, ClaimSeeds: true,
		EnginePriority: s.Fleet.EnginePriority}
	for _, seed := range s.Seeds {
		if seed < ClaimSeeds {
			res.ClaimSeeds = false
		}
	}
	for i := range runs {
		res.GivenTokens = res.GivenTokens || runs[i].Figures.Responses > 0
	}
	for _, p := range s.Policies {
		if isPeer(p) {
			res.Peers = append(res.Peers, p)
		}
	}
	// by[policy][rate index][seed index]
	by := map[string][][]*Figures{}
	for _, p := range s.Policies {
		by[p] = make([][]*Figures, len(s.Rates))
		for k := range s.Rates {
			by[p][k] = make([]*Figures, len(s.Seeds))
		}
	}
	for i := range runs {
		r := &runs[i]
		by[r.Policy][slices.Index(s.Rates, r.Rate)][slices.Index(s.Seeds, r.Seed)] = &r.Figures
	}
	for _, p := range s.Policies {
		for k, rate := range s.Rates {
			res.Summary = append(res.Summary, summaryOf(p, rate, by[p][k]))
		}
	}
	for _, p := range s.Policies {
		for k, rate := range s.Rates {
			res.Tenants = append(res.Tenants, tenantSummaries(p, rate, by[p][k])...)
		}
	}
	if len(res.Peers) > 0 {
		for k, rate := range s.Rates {
			res.VsBestPeer = append(res.VsBestPeer, ratios(s, res.Peers, by, k, rate)...)
		}
	}
	if len(s.Rates) > 1 {
		for _, p := range s.Policies {
			res.Goodput = append(res.Goodput, goodputOf(p, s, by[p]))
		}
	}
	return res
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// summaryOf is one policy's figures at one rate over the seeds.
func summaryOf(p string, rate float64, fs []*Figures) Summary {
	col := func(of func(*Figures) float64) CI {
		v := make([]float64, len(fs))
		for i, f := range fs {
			v[i] = of(f)
		}
		return ciOf(stats.MeanCI(v))
	}
	s := Summary{Policy: p, Rate: rate,
		HitRate:        col(func(f *Figures) float64 { return float64(f.HitRate) }),
		TTFTMean:       col(func(f *Figures) float64 { return float64(f.TTFTMean) }),
		TTFTP50:        col(func(f *Figures) float64 { return float64(f.TTFTP50) }),
		TTFTP90:        col(func(f *Figures) float64 { return float64(f.TTFTP90) }),
		TTFTP99:        col(func(f *Figures) float64 { return float64(f.TTFTP99) }),
		CompletedShare: col(func(f *Figures) float64 { return f.CompletedShare() }),
		WarmReturnRate: col(func(f *Figures) float64 { return float64(f.WarmReturnRate) }),
		LoadImbalance:  col(func(f *Figures) float64 { return float64(f.LoadImbalance) }),
		LoadCV:         col(func(f *Figures) float64 { return float64(f.LoadCV) })}
	for _, f := range fs {
		s.Refused429 += f.Refused429
		s.Failed += f.Failed
	}
	s.Tiers = tierSummaryOf(fs, col)
	return s
}

// tierSummaryOf is fs' tiers over the seeds (nil when no run touched a
// tier; a run that did not counts as all on GPU or recomputed there).
func tierSummaryOf(fs []*Figures, col func(func(*Figures) float64) CI) *TierSummary {
	any := false
	for _, f := range fs {
		any = any || f.Tiers != nil
	}
	if !any {
		return nil
	}
	// A run that touched no tier hit its GPU cache only.
	tier := func(of func(*Tiers) Num, none func(*Figures) float64) func(*Figures) float64 {
		return func(f *Figures) float64 {
			if f.Tiers == nil {
				return none(f)
			}
			return float64(of(f.Tiers))
		}
	}
	zero := func(*Figures) float64 { return 0 }
	t := &TierSummary{
		GPUHit:         col(tier(func(t *Tiers) Num { return t.GPUHit }, func(f *Figures) float64 { return float64(f.HitRate) })),
		CPUHit:         col(tier(func(t *Tiers) Num { return t.CPUHit }, zero)),
		Pulled:         col(tier(func(t *Tiers) Num { return t.Pulled }, zero)),
		Recomputed:     col(tier(func(t *Tiers) Num { return t.Recomputed }, func(f *Figures) float64 { return 1 - float64(f.HitRate) })),
		PulledGB:       col(tier(func(t *Tiers) Num { return t.PulledGB }, zero)),
		MaxSourceShare: col(tier(func(t *Tiers) Num { return t.MaxSourceShare }, func(*Figures) float64 { return math.NaN() })),
	}
	for _, f := range fs {
		if f.Tiers != nil {
			t.SourcesNamed += f.Tiers.SourcesNamed
			t.Pulls += f.Tiers.Pulls
			t.MissedPulls += f.Tiers.MissedPulls
			t.FailedWithPull += f.Tiers.FailedWithPull
		}
	}
	return t
}

// ratios are every policy's paired ratios to the best peer at rate index
// k, per compared figure.
func ratios(s Sweep, peers []string, by map[string][][]*Figures, k int, rate float64) []Ratio {
	var out []Ratio
	for _, fig := range compared() {
		values := map[string][]float64{}
		for _, p := range s.Policies {
			v := make([]float64, len(s.Seeds))
			for i, f := range by[p][k] {
				v[i] = fig.of(f)
			}
			values[p] = v
		}
		best := stats.BestPerSeed(values, peers, fig.higherBetter)
		for _, p := range s.Policies {
			iv, per := stats.PairedRatio(values[p], best, uint64(k)+1)
			r := Ratio{Policy: p, Figure: fig.name, Rate: rate, Ratio: ciOf(iv)}
			for _, x := range per {
				r.PerSeed = append(r.PerSeed, Num(x))
			}
			out = append(out, r)
		}
	}
	return out
}

// goodputOf is p's goodput per seed over the sweep's rates.
func goodputOf(p string, s Sweep, fs [][]*Figures) Goodput {
	g := Goodput{Policy: p}
	v := make([]float64, len(s.Seeds))
	for i := range s.Seeds {
		var pts []stats.Point
		for k, rate := range s.Rates {
			f := fs[k][i]
			p90 := time.Duration(float64(f.TTFTP90) * float64(time.Millisecond))
			if math.IsNaN(float64(f.TTFTP90)) {
				p90 = time.Duration(math.MaxInt64)
			}
			pts = append(pts, stats.Point{Rate: rate, P90TTFT: p90, Completed: f.Completed, Offered: f.Requests})
		}
		if r, ok := stats.Goodput(pts, s.SLO); ok {
			v[i] = r
		}
		g.PerSeed = append(g.PerSeed, Num(v[i]))
	}
	g.Goodput = ciOf(stats.MeanCI(v))
	return g
}

// profileName is the profile a run's engines use.
func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func profileName(p string) string {
	if p == "" {
		return profile.SimDefault
	}
	return p
}
