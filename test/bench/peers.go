package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvroute/kvroute/picker/peers"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/enginesim"
)

// PeerComparison is results.json's "vs_best_peer": every policy of the
// run against the best peer policy (score.PeerPolicies: llm-d,
// llm-d-precise, dynamo, sglang; and LLMDCalibrated) that ran, figure by
// figure. The best peer is chosen per figure — the highest hit rate, the
// lowest mean TTFT, the lowest p99 TTFT — among the peers with at least
// one answered request, so the three may be different peers. llm-d is
// one peer there: when both its runs answered (the guide's defaults,
// llm-d, and LLMDCalibrated), the stronger of the two on the primary
// figure (PrimaryFigure, the mean TTFT) stands for it, named in "llm_d";
// the other still gets its ratios. A ratio is the policy's figure ÷ the
// best peer's: above 1 is better for the hit rate, below 1 for the
// TTFTs; the best peer's own is 1.
//
//	"vs_best_peer": {
//	  "primary_figure": "ttft_mean",
//	  "llm_d": "llm-d-calibrated",
//	  "best_peer": {"hit_rate": "llm-d-precise", "ttft_mean": "dynamo", "ttft_p99": "dynamo"},
//	  "best":      {"hit_rate": 0.48, "ttft_mean_ms": 310.2, "ttft_p99_ms": 1250},
//	  "ratios":    {"precise": {"hit_rate": 1.04, "ttft_mean": 0.91, "ttft_p99": 0.85}, …}
//	}
//
// A ratio is null where it is undefined: for a policy with no answered
// request, or when the best peer's figure is 0.
type PeerComparison struct {
	// PrimaryFigure is the figure llm-d's two runs are judged by.
	PrimaryFigure string `json:"primary_figure"`
	// LLMD is the llm-d run that stood for llm-d ("llm-d" or
	// "llm-d-calibrated"); "" unless both answered.
	LLMD     string `json:"llm_d,omitempty"`
	BestPeer struct {
		HitRate  string `json:"hit_rate"`
		TTFTMean string `json:"ttft_mean"`
		TTFTP99  string `json:"ttft_p99"`
	} `json:"best_peer"`
	Best struct {
		HitRate    float64 `json:"hit_rate"`
		TTFTMeanMs float64 `json:"ttft_mean_ms"`
		TTFTP99Ms  float64 `json:"ttft_p99_ms"`
	} `json:"best"`
	Ratios map[string]PeerRatios `json:"ratios"`
}

// PeerRatios are one policy's figures ÷ the best peer's.
type PeerRatios struct {
	HitRate  *float64 `json:"hit_rate"`
	TTFTMean *float64 `json:"ttft_mean"`
	TTFTP99  *float64 `json:"ttft_p99"`
}

// LLMDCalibrated is `kvroute bench`'s second llm-d run: llm-d's "sticky
// until saturated" profile with its load gate calibrated on the run's own
// engines by llm-d's recipe (calibrateLLMD), where the policy named llm-d
// keeps the guide's values, measured on other hardware
// (shared/docs/peer-policies.md §1.2 "Calibration"). The picker runs it
// as score.LLMD.
const LLMDCalibrated score.Policy = "llm-d-calibrated"

// PrimaryFigure is the figure llm-d's two runs are judged by, to choose
// the one that stands for llm-d against the other peers: the mean TTFT
// (lower is better), on every scenario — on the hit rate the sticky
// policies mostly tie at the pooled bound.
const PrimaryFigure = "ttft_mean"

// IsPeer reports whether the bench's policy p is a peer's: the picker's
// peer policies and LLMDCalibrated.
func IsPeer(p string) bool { return score.Policy(p).IsPeer() || p == string(LLMDCalibrated) }

// pickerPolicy is the picker's policy for the bench's p.
func pickerPolicy(p score.Policy) score.Policy {
	if p == LLMDCalibrated {
		return score.LLMD
	}
	return p
}

// ComparePeers sets every policy of r against the best peer that ran; nil
// when no peer policy ran (or none answered a request).
func ComparePeers(r *Results) *PeerComparison {
	c := &PeerComparison{PrimaryFigure: PrimaryFigure, Ratios: map[string]PeerRatios{}}
	weaker := ""
	def, cal := r.Policies[string(score.LLMD)], r.Policies[string(LLMDCalibrated)]
	if def != nil && cal != nil && answered(def) && answered(cal) {
		c.LLMD, weaker = string(score.LLMD), string(LLMDCalibrated)
		if cal.TTFTms.Mean < def.TTFTms.Mean {
			c.LLMD, weaker = weaker, c.LLMD
		}
	}
	found := false
	for _, p := range r.Order {
		x := r.Policies[p]
		if x == nil || !IsPeer(p) || !answered(x) || p == weaker {
			continue
		}
		if !found || x.HitRate > c.Best.HitRate {
			c.Best.HitRate, c.BestPeer.HitRate = x.HitRate, p
		}
		if !found || x.TTFTms.Mean < c.Best.TTFTMeanMs {
			c.Best.TTFTMeanMs, c.BestPeer.TTFTMean = x.TTFTms.Mean, p
		}
		if !found || x.TTFTms.P99 < c.Best.TTFTP99Ms {
			c.Best.TTFTP99Ms, c.BestPeer.TTFTP99 = x.TTFTms.P99, p
		}
		found = true
	}
	if !found {
		return nil
	}
	ratio := func(v, best float64) *float64 {
		if best == 0 {
			return nil
		}
		q := v / best
		return &q
	}
	for _, p := range r.Order {
		x := r.Policies[p]
		if x == nil {
			continue
		}
		var pr PeerRatios
		if answered(x) {
			pr = PeerRatios{HitRate: ratio(x.HitRate, c.Best.HitRate), TTFTMean: ratio(x.TTFTms.Mean, c.Best.TTFTMeanMs),
				TTFTP99: ratio(x.TTFTms.P99, c.Best.TTFTP99Ms)}
		}
		c.Ratios[p] = pr
	}
	return c
}

// answered reports whether a policy answered any request.
func answered(x *PolicyResult) bool { return x.Requests > x.Errors }

// ratioText words a ratio ("1.04×", "-" when undefined).
func ratioText(q *float64) string {
	if q == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f×", *q)
}

// peerTable is summary.txt's block against the best peer ("" without one).
func peerTable(r *Results) string {
	c := r.VsBestPeer
	if c == nil {
		return ""
	}
	var b strings.Builder
	w, cell := nameWidth(r), 22+nameWidth(r)-13
	fmt.Fprintf(&b, "\nagainst the best peer (this policy's figure ÷ the best peer's; hit rate: higher is better, TTFT: lower is better)\n")
	if c.LLMD != "" {
		fmt.Fprintf(&b, "llm-d is %s here: the stronger of its two runs on the primary figure (%s)\n", r.Label(c.LLMD), figureName(c.PrimaryFigure))
	}
	fmt.Fprintf(&b, "%-*s %*s %*s %*s%s\n", w, "policy", cell, "hit rate", cell, "ttft mean", cell, "ttft p99", shedHeader(r))
	fmt.Fprintf(&b, "%-*s %*s %*s %*s\n", w, "best peer",
		cell, fmt.Sprintf("%s %.1f%%", r.Label(c.BestPeer.HitRate), 100*c.Best.HitRate),
		cell, fmt.Sprintf("%s %.0fms", r.Label(c.BestPeer.TTFTMean), c.Best.TTFTMeanMs),
		cell, fmt.Sprintf("%s %.0fms", r.Label(c.BestPeer.TTFTP99), c.Best.TTFTP99Ms))
	for _, p := range r.Order {
		x, ok := c.Ratios[p]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "%-*s %*s %*s %*s%s\n", w, r.Label(p), cell, ratioText(x.HitRate), cell, ratioText(x.TTFTMean), cell, ratioText(x.TTFTP99),
			shedCell(r, r.Policies[p]))
	}
	return b.String()
}

// figureName words a figure's results.json name.
func figureName(f string) string {
	return map[string]string{"ttft_mean": "mean TTFT", "ttft_p99": "p99 TTFT", "hit_rate": "hit rate"}[f]
}

// Label is policy p's name in tables and charts: "llm-d-precise (given
// tokens)" when the scenario sent /v1/responses (upstream llm-d cannot
// tokenize a Responses request and scores it on load alone; the picker
// hands the arm exact tokens), "llm-d (default)" beside llm-d-calibrated;
// else p. results.json keeps p as the key and lists the labels that
// differ in "policy_labels".
func (r *Results) Label(p string) string {
	if l, ok := r.Labels[p]; ok {
		return l
	}
	return p
}

// policyLabels are the labels of r's policies that differ from their
// names (Label).
func policyLabels(r *Results) map[string]string {
	out := map[string]string{}
	for _, p := range r.Order {
		switch {
		case p == string(score.LLMDPrecise) && r.SendsResponses:
			out[p] = p + " (given tokens)"
		case p == string(score.LLMD) && slices.Contains(r.Order, string(LLMDCalibrated)):
			out[p] = p + " (default)"
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// nameWidth is the policy column's width in summary.txt: the longest
// label, at least 13.
func nameWidth(r *Results) int {
	w := 13
	for _, p := range r.Order {
		w = max(w, utf8.RuneCountInString(r.Label(p)))
	}
	return w
}

// shedHeader and shedCell are the 429 column of summary.txt's tables,
// with admission on ("" off: nothing is refused).
func shedHeader(r *Results) string {
	if !r.Admission {
		return ""
	}
	return fmt.Sprintf(" %6s", "429")
}

func shedCell(r *Results, x *PolicyResult) string {
	if !r.Admission || x == nil || x.Shed429 == nil {
		return ""
	}
	return fmt.Sprintf(" %6d", *x.Shed429)
}

// LLMDCalibration is results.json's "llm_d_calibration" of the
// LLMDCalibrated policy: llm-d's calibration recipe (calibrate.sh; the
// constants and the arithmetic are picker/peers.CalibrationWarmup,
// CalibrationRequests, CalibrationTMax and CalibratedPeak) run through
// the picker on the policy's own fresh fleet before its scenario. Each
// probe is a streaming /v1/completions of ChunkTokens random token ids in
// [100, 10000] (a miss on every engine) asking for one token, sent one
// at a time; its TTFT is the time to the first data chunk, in simulated
// time. The 5 warm-ups are left out; the peak is ChunkTokens ÷ the
// median of the 20 measured, and the policy runs with it and T_max 18 s:
// τ = peak × 18 s in-flight tokens. The probes count in the picker's
// figures (decisions, overhead) but not in the scenario's.
type LLMDCalibration struct {
	// ChunkTokens is the engines' --max-num-batched-tokens (at most their
	// context length less one token).
	ChunkTokens int       `json:"chunk_tokens"`
	Warmup      int       `json:"warmup"`
	TTFTms      []float64 `json:"ttft_ms"` // the measured probes', in order
	// MedianTTFTms is the measured TTFTs' median (the middle two's mean).
	MedianTTFTms float64 `json:"median_ttft_ms"`
	// PeakPrefillThroughput is ChunkTokens ÷ the median, in tokens per
	// simulated second, truncated as the recipe prints it.
	PeakPrefillThroughput float64 `json:"peak_prefill_throughput"`
	MaxTTFTPenaltySeconds float64 `json:"max_ttft_penalty_s"`
	TauTokens             float64 `json:"tau_tokens"` // peak × penalty
}

// calibrationModel is the model the probes name (the fleet's).
const calibrationModel = "Qwen/Qwen3-0.6B"

// setUpFleet readies a fresh fleet for policy p before its scenario:
// admission off unless o.Admission (Router.AdmitAll), and for
// LLMDCalibrated the load gate measured and set (calibrateLLMD), whose
// figures it returns.
func setUpFleet(ctx context.Context, o Options, f *Fleet, p score.Policy, scale float64) (*LLMDCalibration, error) {
	if !o.Admission {
		for _, pk := range f.Pickers() {
			pk.Router().AdmitAll()
		}
	}
	if p != LLMDCalibrated {
		return nil, nil
	}
	chunk := min(enginesim.DefaultConfig().MaxNumBatchedTokens, f.MaxModelLen()-1)
	return calibrateLLMD(ctx, f, chunk, scale, o.Seed)
}

// calibrateLLMD runs llm-d's recipe through f's (first) picker
// (LLMDCalibration) and sets the measured peak and T_max on every
// picker's llm-d policy.
func calibrateLLMD(ctx context.Context, f *Fleet, chunk int, scale float64, seed uint64) (*LLMDCalibration, error) {
	rng := rand.New(rand.NewPCG(seed, 0x6c6c6d2d64)) // a prompt of its own for each probe
	hc := &http.Client{Timeout: RequestTimeout}
	var ttfts []time.Duration
	for i := range peers.CalibrationWarmup + peers.CalibrationRequests {
		ids := make([]int, chunk)
		for j := range ids {
			ids[j] = 100 + rng.IntN(9901)
		}
		wall, err := probeTTFT(ctx, hc, f.PickerURL(), ids)
		if err != nil {
			return nil, fmt.Errorf("llm-d calibration, probe %d: %w", i+1, err)
		}
		if i >= peers.CalibrationWarmup {
			ttfts = append(ttfts, time.Duration(float64(wall)/scale))
		}
	}
	peak := peers.CalibratedPeak(chunk, ttfts)
	for _, pk := range f.Pickers() { // one measurement of the engines, every replica's gate
		if err := pk.Router().SetLLMDLoadGate(peak, peers.CalibrationTMax); err != nil {
			return nil, fmt.Errorf("llm-d calibration: peak %v tokens/s: %w", peak, err)
		}
	}
	cal := &LLMDCalibration{ChunkTokens: chunk, Warmup: peers.CalibrationWarmup, PeakPrefillThroughput: peak,
		MedianTTFTms: msOf(peers.MedianDuration(ttfts)), MaxTTFTPenaltySeconds: peers.CalibrationTMax.Seconds(),
		TauTokens: peak * peers.CalibrationTMax.Seconds()}
	for _, d := range ttfts {
		cal.TTFTms = append(cal.TTFTms, msOf(d))
	}
	return cal, nil
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// probeTTFT sends one calibration probe, a streaming completion of the
// token ids asking for one token, reads the answer whole and returns the
// time (wall) to its first data chunk.
func probeTTFT(ctx context.Context, hc *http.Client, picker string, ids []int) (time.Duration, error) {
	body, _ := json.Marshal(map[string]any{"model": calibrationModel, "prompt": ids, "max_tokens": 1, "stream": true, "temperature": 0})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, picker+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	var ttft time.Duration
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		if line := sc.Text(); ttft == 0 && strings.HasPrefix(line, "data:") && !strings.Contains(line, "[DONE]") {
			ttft = time.Since(start)
		}
	}
	switch {
	case sc.Err() != nil:
		return 0, sc.Err()
	case ttft == 0:
		return 0, fmt.Errorf("no data chunk in the stream")
	}
	return ttft, nil
}

// calibrationTable is summary.txt's block on llm-d's load gates ("" when
// llm-d-calibrated did not run).
func calibrationTable(r *Results) string {
	x := r.Policies[string(LLMDCalibrated)]
	if x == nil || x.LLMDCalibration == nil {
		return ""
	}
	c, d := x.LLMDCalibration, peers.DefaultLLMDConfig()
	var b strings.Builder
	fmt.Fprintf(&b, "\nllm-d's load gate (prefix-cache-affinity filter), τ = peak prefill throughput × T_max\n")
	fmt.Fprintf(&b, "  %s: %.0f tokens/s, measured on these engines by llm-d's recipe through the picker (%d probes of %d random token ids "+
		"after %d warm-up, median TTFT %.0f ms); T_max %.0f s: τ = %.0f tokens\n",
		r.Label(string(LLMDCalibrated)), c.PeakPrefillThroughput, len(c.TTFTms), c.ChunkTokens, c.Warmup, c.MedianTTFTms,
		c.MaxTTFTPenaltySeconds, c.TauTokens)
	if slices.Contains(r.Order, string(score.LLMD)) {
		fmt.Fprintf(&b, "  %s: the guide's %.0f tokens/s (measured on other hardware); T_max %.0f s: τ = %.0f tokens\n",
			r.Label(string(score.LLMD)), d.PeakPrefillThroughput, d.MaxTTFTPenaltyMs/1000, d.PeakPrefillThroughput*d.MaxTTFTPenaltyMs/1000)
	}
	return b.String()
}
