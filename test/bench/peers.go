package bench

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/picker/score"
)

// PeerComparison is results.json's "vs_best_peer": every policy of the
// run against the best peer policy (score.PeerPolicies: llm-d,
// llm-d-precise, dynamo, sglang) that ran, figure by figure. The best peer
// is chosen per figure — the highest hit rate, the lowest mean TTFT, the
// lowest p99 TTFT — among the peers with at least one answered request, so
// the three may be different peers. A ratio is the policy's figure ÷ the
// best peer's: above 1 is better for the hit rate, below 1 for the TTFTs;
// the best peer's own is 1.
//
//	"vs_best_peer": {
//	  "best_peer": {"hit_rate": "llm-d-precise", "ttft_mean": "dynamo", "ttft_p99": "dynamo"},
//	  "best":      {"hit_rate": 0.48, "ttft_mean_ms": 310.2, "ttft_p99_ms": 1250},
//	  "ratios":    {"precise": {"hit_rate": 1.04, "ttft_mean": 0.91, "ttft_p99": 0.85}, …}
//	}
//
// A ratio is null where it is undefined: for a policy with no answered
// request, or when the best peer's figure is 0.
type PeerComparison struct {
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

// ComparePeers sets every policy of r against the best peer that ran; nil
// when no peer policy ran (or none answered a request).
func ComparePeers(r *Results) *PeerComparison {
	c := &PeerComparison{Ratios: map[string]PeerRatios{}}
	found := false
	for _, p := range r.Order {
		x := r.Policies[p]
		if x == nil || !score.Policy(p).IsPeer() || !answered(x) {
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
	fmt.Fprintf(&b, "\nagainst the best peer (this policy's figure ÷ the best peer's; hit rate: higher is better, TTFT: lower is better)\n")
	fmt.Fprintf(&b, "%-13s %22s %22s %22s\n", "policy", "hit rate", "ttft mean", "ttft p99")
	fmt.Fprintf(&b, "%-13s %22s %22s %22s\n", "best peer",
		fmt.Sprintf("%s %.1f%%", c.BestPeer.HitRate, 100*c.Best.HitRate),
		fmt.Sprintf("%s %.0fms", c.BestPeer.TTFTMean, c.Best.TTFTMeanMs),
		fmt.Sprintf("%s %.0fms", c.BestPeer.TTFTP99, c.Best.TTFTP99Ms))
	for _, p := range r.Order {
		x, ok := c.Ratios[p]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "%-13s %22s %22s %22s\n", p, ratioText(x.HitRate), ratioText(x.TTFTMean), ratioText(x.TTFTP99))
	}
	return b.String()
}
