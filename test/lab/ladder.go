package lab

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/picker/peers"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/sched"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
)

// The arms with KV pulls run a second time with their
// p2p-source-producer's minCachedTokenDelta at the crossover llm-d's
// ladder measures on the lab's engines (peer-policies.md §4: "at the
// upstream value below and at the crossover measured on the lab's
// profile"; RunLadder), where the arm's own name keeps the upstream value
// (2048, 1 and 2048). The ladder runs once per sweep, on the sweep's
// profile; results.json records it (Results.P2PLadder).
const (
	LLMDPreciseP2PCalibrated = "llm-d-precise+p2p-calibrated"
	LLMDP2PCalibrated        = "llm-d+p2p-calibrated"
	LLMDLoadP2PCalibrated    = "llm-d-load+p2p-calibrated"
)

// calibratedArms maps each calibrated name to the arm it runs.
var calibratedArms = map[string]score.Policy{
	LLMDPreciseP2PCalibrated: score.LLMDPreciseP2P,
	LLMDP2PCalibrated:        score.LLMDP2P,
	LLMDLoadP2PCalibrated:    score.LLMDLoadP2P,
}

// isCalibratedArm: name is an arm run at the ladder's threshold.
func isCalibratedArm(name string) bool { _, ok := calibratedArms[name]; return ok }

// Ladder is llm-d's calibrate-min-cached-token-delta.sh run on a pod pair
// of the lab's engines: the table it prints and the value it recommends.
type Ladder struct {
	Profile     string `json:"profile"`
	BlockSize   int    `json:"block_size"`
	MaxModelLen int    `json:"max_model_len"`
	// WarmTokens is the mesh warm's prompt and WarmPullms its request
	// time, the pair's first pull (connection included), discarded.
	WarmTokens int    `json:"warm_tokens"`
	WarmPullms Num    `json:"warm_pull_ms"`
	Rungs      []Rung `json:"rungs"`
	// Skipped are the ladder's lengths the engines' max_model_len
	// refuses (a prompt and its one output token must fit).
	Skipped []int `json:"skipped_tokens,omitempty"`
	// MinCachedTokenDelta is the recommendation: the smallest length at
	// which the median pull beat the median recompute
	// (peers.CalibratedMinCachedTokenDelta).
	MinCachedTokenDelta int `json:"min_cached_token_delta"`
}

// Rung is one length of the ladder: each repetition's request times on
// the consumer (to its one token), without and with the pull.
type Rung struct {
	Tokens      int   `json:"tokens"`
	RecomputeMs []Num `json:"recompute_ms"`
	PullMs      []Num `json:"pull_ms"`
	// PulledTokens is what each pull moved: the prompt's whole blocks
	// within vLLM's len−1 cap (the last block is recomputed).
	PulledTokens int `json:"pulled_tokens"`
	// TransferMs is the pull's time on the links (both ends idle, the
	// pair warmed), the median over the repetitions; PulledMB the median
	// bytes a pull leg loaded into the consumer's GPU from its offload
	// tier (the recipe's CPU_to_GPU counter; the recompute legs' must be
	// 0).
	TransferMs Num  `json:"transfer_ms"`
	PulledMB   Num  `json:"pulled_mb"`
	PullWins   bool `json:"pull_wins"`
}

// The recipe's constants (calibration-min-cached-token-delta.yaml): the
// mesh warm's prompt, the random token ids' range, and the pauses it
// sleeps after seeding and after each leg (kept in virtual time; the
// engines are idle through them).
const (
	ladderWarmTokens         = 4096
	ladderTokenMin           = 1000
	ladderTokenMax           = 30000
	ladderWarmPause          = 3 * time.Second
	ladderPause              = 2 * time.Second
	ladderSource, ladderDest = "ladder-source", "ladder-consumer"
)

// RunLadder runs llm-d's calibrate-min-cached-token-delta.sh
// (peer-policies.md §4, kv-transfer.md §4, §6) on the lab's engine core
// for profile prof ("" sim-default): two engines of the profile (its
// chunk budget, GPU blocks and max_model_len, each with a CPU tier large
// enough that nothing is evicted and the P2P tier), driven in virtual
// time as the lab's shell drives its engines (a lookup answered from the
// source's CPU tier at its At, the pull priced by transfer.Links and
// bounded by transfer.PullTimeout). As the recipe does:
//   - the mesh is warmed first: a fresh 4,096-token prompt seeded on the
//     source, then pulled by the consumer (the pair's first pull, which
//     pays the connection; discarded);
//   - for each of peers.P2PCalibrationLengths that max_model_len allows
//     (a prompt of L tokens and its one output token; the rest are
//     Skipped), peers.P2PCalibrationReps times: a fresh prompt of L random
//     token ids (1,000 to 30,000, the recipe's) is seeded on the source
//     (served there to completion, so its prompt blocks reach its CPU
//     tier) and the consumer serves the same prompt without
//     remote_kv_source (recompute, the control); a second fresh prompt is
//     seeded and the consumer serves it with the source named (pull).
//     Each is the recipe's completions body, max_tokens 1, through the
//     engine's front end; the recipe sends no suffix, so the consumer's
//     cached prefix stops at vLLM's len−1 cap: the pull moves L − block
//     tokens and the last block is recomputed. The time is the
//     scheduler's TTFT (the request ends with its one token); the bytes
//     are the consumer's offload loads (Step.LoadedBytes) during the leg;
//   - the probes go to peers.CalibratedMinCachedTokenDelta.
//
// Pure and deterministic: the token ids come from seed; nothing reads a
// clock. An error when an engine refuses or a request never ends; when
// the recipe finds no threshold (no pull moved bytes, a control moved
// some, or no length won) the table is returned with the error.
func RunLadder(prof string, seed uint64) (Ladder, error) {
	prof = profileName(prof)
	p, err := profile.Named(prof)
	if err != nil {
		return Ladder{}, err
	}
	ecfg, err := engineConfig(prof, p.NumGPUBlocks, p.MaxModelLen)
	if err != nil {
		return Ladder{}, err
	}
	bs := ecfg.BlockSize
	l := Ladder{Profile: prof, BlockSize: bs, MaxModelLen: ecfg.MaxModelLen}
	var lengths []int
	for _, n := range peers.P2PCalibrationLengths() {
		switch {
		case n%bs != 0:
			return l, fmt.Errorf("p2p ladder: %d tokens is not a multiple of the block size %d", n, bs)
		case n+1 > ecfg.MaxModelLen:
			l.Skipped = append(l.Skipped, n)
		default:
			lengths = append(lengths, n)
		}
	}
	l.WarmTokens = min(ladderWarmTokens, (ecfg.MaxModelLen-1)/bs*bs)
	total := l.WarmTokens
	for _, n := range lengths {
		total += 2 * peers.P2PCalibrationReps * n
	}
	pair, err := newLadderPair(ecfg, p, (total+bs-1)/bs+1, seed)
	if err != nil {
		return l, err
	}
	warm := pair.fresh(l.WarmTokens)
	if err := pair.seed(warm); err != nil {
		return l, err
	}
	pair.now += ladderWarmPause
	w, err := pair.serve(pair.dst, warm, true)
	if err != nil {
		return l, err
	}
	l.WarmPullms = ladderMs(w.ttft)
	var probes []peers.P2PProbe
	for _, n := range lengths {
		pr := peers.P2PProbe{Tokens: n}
		rung := Rung{Tokens: n}
		var transfers []time.Duration
		var mbs []float64
		for rep := 0; rep < peers.P2PCalibrationReps; rep++ {
			for _, pull := range []bool{false, true} {
				ids := pair.fresh(n)
				if err := pair.seed(ids); err != nil {
					return l, err
				}
				pair.now += ladderPause
				g, err := pair.serve(pair.dst, ids, pull)
				if err != nil {
					return l, err
				}
				pair.now += ladderPause
				if pull {
					pr.Pull, pr.PullBytes = append(pr.Pull, g.ttft), append(pr.PullBytes, float64(g.loaded))
					rung.PullMs = append(rung.PullMs, ladderMs(g.ttft))
					rung.PulledTokens = g.pulled
					transfers, mbs = append(transfers, g.transfer), append(mbs, float64(g.loaded)/1e6)
				} else {
					pr.Recompute, pr.RecomputeBytes = append(pr.Recompute, g.ttft), append(pr.RecomputeBytes, float64(g.loaded))
					rung.RecomputeMs = append(rung.RecomputeMs, ladderMs(g.ttft))
				}
			}
		}
		rung.TransferMs, rung.PulledMB = ladderMs(peers.MedianDuration(transfers)), Num(ladderMedian(mbs))
		rung.PullWins = ladderMedian(pr.PullBytes) > 0 && peers.MedianDuration(pr.Pull) < peers.MedianDuration(pr.Recompute)
		probes = append(probes, pr)
		l.Rungs = append(l.Rungs, rung)
	}
	d, err := peers.CalibratedMinCachedTokenDelta(probes)
	if err != nil {
		return l, fmt.Errorf("p2p ladder on %s: %w", prof, err)
	}
	l.MinCachedTokenDelta = d
	return l, nil
}

// ladderPair is the recipe's two pods: the source, where prompts are
// seeded, and the consumer, timed; the links between them; the virtual
// clock.
type ladderPair struct {
	front    *enginesim.Front
	model    string
	p        profile.Profile
	bs       int
	src, dst *sched.Scheduler
	links    transfer.Links
	now      time.Duration
	next     sched.ID
	rng      *rand.Rand
}

func newLadderPair(ecfg enginesim.Config, p profile.Profile, cpuBlocks int, seed uint64) (*ladderPair, error) {
	front, err := enginesim.NewFront(ecfg)
	if err != nil {
		return nil, err
	}
	scfg := front.Sched()
	// vLLM's OffloadingConnector with the CPU spec and its P2P tier, as
	// the lab's fleet builds them: an offload block of one GPU block,
	// prompt blocks only.
	scfg.Cache.CPUBlocks, scfg.Cache.OffloadBlocks, scfg.Cache.OffloadPromptOnly = cpuBlocks, 1, true
	pair := &ladderPair{front: front, model: ecfg.Model, p: scfg.Latency, bs: scfg.Cache.BlockSize,
		rng: rand.New(rand.NewPCG(seed, 0x6c6164646572))}
	if pair.src, err = sched.New(scfg); err != nil {
		return nil, err
	}
	if pair.dst, err = sched.New(scfg); err != nil {
		return nil, err
	}
	return pair, nil
}

// fresh is a prompt of n random token ids, new to both pods.
func (l *ladderPair) fresh(n int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(ladderTokenMin + l.rng.IntN(ladderTokenMax-ladderTokenMin+1))
	}
	return ids
}

// seed serves ids on the source to completion: its prompt blocks are in
// the source's CPU tier after it.
func (l *ladderPair) seed(ids []uint32) error {
	_, err := l.serve(l.src, ids, false)
	return err
}

// ladderLeg is one request's figures: its TTFT, the bytes its engine
// loaded from its offload tier into the GPU meanwhile, and its pull's
// time on the links and tokens (0 without one).
type ladderLeg struct {
	ttft, transfer time.Duration
	loaded         int64
	pulled         int
}

// serve sends the recipe's body for ids to e (the source named when
// pull) and steps e alone until the request ends, answering its lookup
// as the lab's shell does (run.lookup).
func (l *ladderPair) serve(e *sched.Scheduler, ids []uint32, pull bool) (ladderLeg, error) {
	var leg ladderLeg
	b := make([]byte, 0, 6*len(ids)+96)
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, l.model)
	b = append(b, `,"prompt":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	b = append(b, `],"max_tokens":1,"temperature":0}`...)
	g, err := l.front.Prepare("/v1/completions", b)
	if err != nil {
		return leg, fmt.Errorf("p2p ladder: the engine refused a %d-token prompt: %w", len(ids), err)
	}
	l.next++
	id := l.next
	req := sched.Request{ID: id, Prompt: g.Prompt, LoRA: g.LoRA, LoraID: g.LoraID, Salt: g.Salt, MaxTokens: g.MaxTokens, IgnoreEOS: g.IgnoreEOS}
	if pull {
		req.Source = ladderSource
	}
	if err := e.Add(req, l.now); err != nil {
		return leg, fmt.Errorf("p2p ladder: %w", err)
	}
	var pending []sched.Lookup
	first := false
	for steps := 0; steps < 1_000_000; steps++ {
		st := e.Step(l.now)
		leg.loaded += st.LoadedBytes
		pending = append(pending, st.Lookups...)
		done := false
		for _, u := range st.Updates {
			if u.ID != id {
				continue
			}
			if u.First {
				leg.ttft, first = u.TTFT, true
			}
			done = done || u.Finish != ""
		}
		l.now += st.Duration
		if done {
			if !first {
				return leg, errors.New("p2p ladder: a request ended without its first token")
			}
			return leg, nil
		}
		if st.Duration > 0 {
			for len(pending) > 0 && pending[0].At <= l.now {
				if err := l.answer(e, pending[0], &leg); err != nil {
					return leg, err
				}
				pending = pending[1:]
			}
			continue
		}
		switch {
		case len(pending) > 0: // nothing computed: the lookup's answer is next
			l.now = max(l.now, pending[0].At)
			if err := l.answer(e, pending[0], &leg); err != nil {
				return leg, err
			}
			pending = pending[1:]
		case e.NextReady() > 0:
			l.now = max(l.now, e.NextReady())
		default:
			return leg, fmt.Errorf("p2p ladder: request %d stalled at %v", id, l.now)
		}
	}
	return leg, fmt.Errorf("p2p ladder: request %d did not end", id)
}

// answer is run.lookup for the pair: the source answers from its CPU tier
// at the lookup's At, the blocks travel over the links, a pull that would
// outlast transfer.PullTimeout fails into a recompute.
func (l *ladderPair) answer(e *sched.Scheduler, lk sched.Lookup, leg *ladderLeg) error {
	blocks := 0
	if lk.Source == ladderSource && e != l.src {
		blocks = l.src.ServeLookup(lk.Hashes)
	}
	ready, failed := lk.At, false
	if blocks > 0 {
		end, _ := l.links.Start(ladderSource, ladderDest, blocks*l.bs, lk.At, l.p)
		leg.transfer, leg.pulled = end-lk.At, blocks*l.bs
		if end-lk.At > transfer.PullTimeout {
			ready, failed, blocks = lk.At+transfer.PullTimeout, true, 0
		} else {
			ready = end
		}
	}
	if err := e.Resolve(lk.ID, blocks, ready, failed); err != nil {
		return fmt.Errorf("p2p ladder: resolve: %w", err)
	}
	return nil
}

// ladderMs is d in milliseconds.
func ladderMs(d time.Duration) Num { return Num(float64(d) / float64(time.Millisecond)) }

// ladderMedian is the median of v (the middle two's mean for an even count);
// 0 for none.
func ladderMedian(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
