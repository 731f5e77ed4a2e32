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
// empty windows left out, errors ignored, times in simulated seconds, and
// fewer windows for fewer requests.
func TestHitRateOverTime(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int, prompt, cached int) Outcome {
		return Outcome{Start: t0.Add(time.Duration(ms) * time.Millisecond), PromptTokens: prompt, CachedTokens: cached}
	}
	// 244 answered requests over 2 s of wall time (4 simulated): 20
	// windows of 0.2 simulated seconds; nothing starts in 1.0–1.2 s.
	var outs []Outcome
	for k := 0; k < 20; k++ {
		for j := 0; j < 12; j++ {
			ms := 100*k + 8*j
			if k == 5 {
				ms += 100 // into the next window
			}
			outs = append(outs, at(ms, 100, 5*k))
		}
	}
	outs = append(outs, at(2500, 100, 100), at(2100, 100, 100), at(440, 100, 100), at(460, 100, 100), // past the end: the last window
		Outcome{Start: t0.Add(time.Second / 2), Err: errString("boom"), PromptTokens: 100}) // an error: not counted
	s := hitRateOverTime(outs, t0, 2*time.Second, 0.5)
	if len(s.Seconds) != 19 || len(s.HitRate) != 19 || len(s.Requests) != 19 {
		t.Fatalf("%d windows: %+v", len(s.Seconds), s)
	}
	if s.Requests[0] != 12 || s.HitRate[0] != 0 || math.Abs(s.Seconds[0]-0.1) > 1e-9 {
		t.Fatalf("first window: %v %v %v", s.Requests[0], s.HitRate[0], s.Seconds[0])
	}
	if s.Requests[4] != 14 || math.Abs(s.HitRate[4]-(12*0.2+2)/14) > 1e-9 { // 400–500 ms, with the two extra
		t.Fatalf("window 5: %v %v", s.Requests[4], s.HitRate[4])
	}
	if math.Abs(s.Seconds[5]-1.3) > 1e-9 || s.Requests[5] != 24 { // window 6 (1.0–1.2 s) is empty and left out
		t.Fatalf("after the gap: %v at %v", s.Requests[5], s.Seconds[5])
	}
	if last := len(s.Seconds) - 1; s.Requests[last] != 14 || math.Abs(s.Seconds[last]-3.9) > 1e-9 {
		t.Fatalf("last window: %v at %v", s.Requests[last], s.Seconds[last])
	}
	// 36 requests: 3 windows.
	if few := hitRateOverTime(outs[:36], t0, 300*time.Millisecond, 1); len(few.Seconds) != 3 || few.Requests[0] != 12 {
		t.Fatalf("36 requests: %+v", few)
	}
	if one := hitRateOverTime(outs[:3], t0, time.Second, 1); len(one.Seconds) != 1 || one.Requests[0] != 3 {
		t.Fatalf("3 requests: %+v", one)
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
