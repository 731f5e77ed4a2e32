package bench

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// peerRun is a result of the named policies with the given hit rates and
// mean and p99 TTFTs.
func peerRun(rows ...struct {
	name           string
	hit, mean, p99 float64
}) *Results {
	r := &Results{Policies: map[string]*PolicyResult{}}
	for _, x := range rows {
		r.Order = append(r.Order, x.name)
		r.Policies[x.name] = &PolicyResult{Requests: 10, HitRate: x.hit, TTFTms: Quantiles{Mean: x.mean, P99: x.p99}}
	}
	return r
}

type row = struct {
	name           string
	hit, mean, p99 float64
}

// TestComparePeers checks the best peer per figure (the figures' best
// may be different peers), the ratios of every policy, and the cases
// without a defined ratio.
func TestComparePeers(t *testing.T) {
	if c := ComparePeers(peerRun(row{"precise", 0.5, 100, 300}, row{"round-robin", 0.1, 200, 600})); c != nil {
		t.Fatalf("no peer ran, yet %+v", c)
	}
	r := peerRun(row{"llm-d", 0.4, 150, 500}, row{"dynamo", 0.5, 200, 400}, row{"sglang", 0.3, 120, 800},
		row{"precise", 0.6, 100, 300}, row{"round-robin", 0.1, 300, 900})
	r.Policies["llm-d-precise"] = &PolicyResult{Requests: 5, Errors: 5} // answered nothing: not a best, no ratios
	r.Order = append(r.Order, "llm-d-precise")
	c := ComparePeers(r)
	if c == nil || c.BestPeer.HitRate != "dynamo" || c.BestPeer.TTFTMean != "sglang" || c.BestPeer.TTFTP99 != "dynamo" ||
		c.Best.HitRate != 0.5 || c.Best.TTFTMeanMs != 120 || c.Best.TTFTP99Ms != 400 {
		t.Fatalf("best peers: %+v", c)
	}
	near := func(q *float64, want float64) bool { return q != nil && math.Abs(*q-want) < 1e-9 }
	p := c.Ratios["precise"]
	if !near(p.HitRate, 1.2) || !near(p.TTFTMean, 100.0/120) || !near(p.TTFTP99, 0.75) {
		t.Fatalf("precise ratios %v %v %v", *p.HitRate, *p.TTFTMean, *p.TTFTP99)
	}
	if d := c.Ratios["dynamo"]; !near(d.HitRate, 1) || !near(d.TTFTP99, 1) || !near(d.TTFTMean, 200.0/120) {
		t.Fatalf("dynamo ratios %+v", d)
	}
	if len(c.Ratios) != 6 || c.Ratios["llm-d-precise"] != (PeerRatios{}) {
		t.Fatalf("ratios %+v", c.Ratios)
	}
	// The schema: names and nulls.
	b, _ := json.Marshal(c)
	var doc struct {
		BestPeer map[string]string              `json:"best_peer"`
		Best     map[string]float64             `json:"best"`
		Ratios   map[string]map[string]*float64 `json:"ratios"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.BestPeer["ttft_mean"] != "sglang" || doc.Best["ttft_p99_ms"] != 400 || *doc.Ratios["round-robin"]["ttft_p99"] != 900.0/400 {
		t.Fatalf("%s", b)
	}
	if v, ok := doc.Ratios["llm-d-precise"]["hit_rate"]; !ok || v != nil {
		t.Fatalf("no-answer policy: %s", b)
	}
	// A best peer with nothing cached: the hit rate ratio is undefined.
	c = ComparePeers(peerRun(row{"sglang", 0, 100, 200}, row{"precise", 0.5, 50, 100}))
	if c == nil || c.Ratios["precise"].HitRate != nil || !near(c.Ratios["precise"].TTFTMean, 0.5) {
		t.Fatalf("zero best hit rate: %+v", c)
	}
	// summary.txt's block.
	r.Fleet.Engines, r.WarmReturnChance = 4, 0.25
	r.VsBestPeer = ComparePeers(r)
	table := Table(r)
	for _, want := range []string{"against the best peer", "dynamo 50.0%", "sglang 120ms", "dynamo 400ms", "1.20×", "0.75×", "2.25×"} {
		if !strings.Contains(table, want) {
			t.Errorf("summary lacks %q:\n%s", want, table)
		}
	}
	if r.VsBestPeer = nil; strings.Contains(Table(r), "best peer") {
		t.Error("summary mentions peers with none run")
	}
}

// TestHitRateOverTime checks the windows: requests counted by their start,
// empty windows left out, errors ignored, times in simulated seconds.
func TestHitRateOverTime(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int, prompt, cached int) Outcome {
		return Outcome{Start: t0.Add(time.Duration(ms) * time.Millisecond), PromptTokens: prompt, CachedTokens: cached}
	}
	outs := []Outcome{at(0, 100, 0), at(40, 100, 50), at(510, 200, 150), at(1999, 100, 100), at(3000, 100, 100),
		{Start: t0.Add(time.Second), Err: errString("boom"), PromptTokens: 100}}
	s := hitRateOverTime(outs, t0, 2*time.Second, 0.5) // 4 simulated seconds, windows of 0.2 s
	if len(s.Seconds) != 3 || len(s.HitRate) != 3 || len(s.Requests) != 3 {
		t.Fatalf("%+v", s)
	}
	if s.Requests[0] != 2 || s.HitRate[0] != 0.25 || math.Abs(s.Seconds[0]-0.1) > 1e-9 {
		t.Fatalf("first window: %+v", s)
	}
	if s.Requests[1] != 1 || s.HitRate[1] != 0.75 || math.Abs(s.Seconds[1]-1.1) > 1e-9 { // 510 ms of 2 s: window 5
		t.Fatalf("second window: %+v", s)
	}
	if s.Requests[2] != 2 || s.HitRate[2] != 1 || math.Abs(s.Seconds[2]-3.9) > 1e-9 { // the last, and one past the end
		t.Fatalf("last window: %+v", s)
	}
	if e := hitRateOverTime(nil, t0, 0, 1); e == nil || e.Seconds == nil || len(e.Seconds) != 0 {
		t.Fatalf("empty: %+v", e)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestOverheadOf reads a histogram: the mean exactly, quantiles as the
// bounds of their buckets, and past the last finite bound, that bound
// marked beyond.
func TestOverheadOf(t *testing.T) {
	h := &dto.Histogram{SampleCount: proto.Uint64(100), SampleSum: proto.Float64(0.03), Bucket: []*dto.Bucket{
		{UpperBound: proto.Float64(0.0001), CumulativeCount: proto.Uint64(10)},
		{UpperBound: proto.Float64(0.00025), CumulativeCount: proto.Uint64(60)},
		{UpperBound: proto.Float64(0.001), CumulativeCount: proto.Uint64(98)},
		{UpperBound: proto.Float64(math.Inf(1)), CumulativeCount: proto.Uint64(100)}}}
	o := overheadOf(h)
	if o.Samples != 100 || math.Abs(o.Mean-300) > 1e-9 || o.P50Bound != 250 || o.P50Beyond || o.P99Bound != 1000 || !o.P99Beyond || o.Note == "" {
		t.Fatalf("%+v", o)
	}
	if o.P50Text() != "≤ 250 µs" || o.P99Text() != "> 1000 µs" {
		t.Fatalf("%q %q", o.P50Text(), o.P99Text())
	}
	if z := overheadOf(&dto.Histogram{}); z.Samples != 0 || z.Mean != 0 {
		t.Fatalf("empty: %+v", z)
	}
}
