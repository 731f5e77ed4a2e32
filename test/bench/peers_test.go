package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/picker/score"
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

// TestComparePeersLLMDRuns: with both llm-d runs, the stronger on the
// primary figure (the mean TTFT) stands for llm-d among the peers, named
// in "llm_d"; the other is no best peer, even on a figure it wins, but
// keeps its ratios. With one run, or one that answered nothing, no
// choice is named.
func TestComparePeersLLMDRuns(t *testing.T) {
	r := peerRun(row{"llm-d", 0.7, 300, 900}, row{"llm-d-calibrated", 0.5, 200, 500}, row{"dynamo", 0.4, 250, 450}, row{"precise", 0.6, 150, 400})
	c := ComparePeers(r)
	if c.PrimaryFigure != "ttft_mean" || c.LLMD != "llm-d-calibrated" {
		t.Fatalf("primary %q, llm-d %q", c.PrimaryFigure, c.LLMD)
	}
	// llm-d (default) has the best hit rate but stood down: dynamo's 0.4
	// is not the best either, the calibrated run's 0.5 is.
	if c.BestPeer.HitRate != "llm-d-calibrated" || c.BestPeer.TTFTMean != "llm-d-calibrated" || c.BestPeer.TTFTP99 != "dynamo" {
		t.Fatalf("best peers %+v", c.BestPeer)
	}
	if d := c.Ratios["llm-d"]; d.HitRate == nil || *d.HitRate != 0.7/0.5 {
		t.Fatalf("the weaker run's ratios %+v", d)
	}
	// The default run stronger on the mean TTFT: it stands.
	r = peerRun(row{"llm-d", 0.3, 100, 900}, row{"llm-d-calibrated", 0.5, 200, 500})
	if c := ComparePeers(r); c.LLMD != "llm-d" || c.BestPeer.HitRate != "llm-d" || c.BestPeer.TTFTP99 != "llm-d" {
		t.Fatalf("default stronger: %+v", c)
	}
	// A tie keeps the guide's run.
	if c := ComparePeers(peerRun(row{"llm-d", 0.3, 100, 900}, row{"llm-d-calibrated", 0.5, 100, 500})); c.LLMD != "llm-d" {
		t.Fatalf("tie: %q", c.LLMD)
	}
	r = peerRun(row{"llm-d-calibrated", 0.5, 200, 500}, row{"precise", 0.6, 150, 400})
	if c := ComparePeers(r); c == nil || c.LLMD != "" || c.BestPeer.TTFTMean != "llm-d-calibrated" {
		t.Fatalf("calibrated alone: %+v", c)
	}
	r = peerRun(row{"llm-d", 0.3, 100, 900}, row{"llm-d-calibrated", 0.5, 200, 500})
	r.Policies["llm-d"].Errors = 10
	if c := ComparePeers(r); c.LLMD != "" || c.BestPeer.TTFTMean != "llm-d-calibrated" {
		t.Fatalf("default answered nothing: %+v", c)
	}
	b, _ := json.Marshal(ComparePeers(peerRun(row{"llm-d", 0.3, 100, 900}, row{"llm-d-calibrated", 0.5, 200, 500})))
	if !strings.Contains(string(b), `"primary_figure":"ttft_mean","llm_d":"llm-d"`) {
		t.Fatalf("%s", b)
	}
}

// TestPolicyLabels: llm-d-precise is "llm-d-precise (given tokens)" in
// every table of a scenario that sent /v1/responses and plain otherwise;
// llm-d is "llm-d (default)" beside llm-d-calibrated; results.json keeps
// the keys and lists the labels.
func TestPolicyLabels(t *testing.T) {
	rows := []row{{"llm-d", 0.3, 100, 900}, {"llm-d-calibrated", 0.5, 200, 500}, {"llm-d-precise", 0.6, 90, 300}, {"precise", 0.6, 80, 300}}
	r := peerRun(rows...)
	r.SendsResponses = true
	r.Labels = policyLabels(r)
	r.VsBestPeer = ComparePeers(r)
	if r.Label("llm-d-precise") != "llm-d-precise (given tokens)" || r.Label("llm-d") != "llm-d (default)" ||
		r.Label("llm-d-calibrated") != "llm-d-calibrated" || r.Label("precise") != "precise" || len(r.Labels) != 2 {
		t.Fatalf("labels %v", r.Labels)
	}
	table := Table(r)
	for _, want := range []string{"llm-d-precise (given tokens)     ", "llm-d (default)", "\nllm-d-calibrated ",
		"llm-d-precise (given tokens) 60.0%", "llm-d is llm-d (default) here"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, "\nllm-d-precise  ") {
		t.Errorf("an unlabelled llm-d-precise row:\n%s", table)
	}
	var page bytes.Buffer
	if err := WriteReport(&page, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<td>llm-d-precise (given tokens)</td>", "<td>llm-d (default)</td>", "<td>llm-d-precise (given tokens): 60.0%</td>",
		`"policy_labels":{"llm-d":"llm-d (default)","llm-d-precise":"llm-d-precise (given tokens)"}`, "llm-d is llm-d (default) here"} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(page.String(), "<td>llm-d-precise</td>") {
		t.Error("the report has an unlabelled llm-d-precise row")
	}
	b, _ := json.Marshal(r)
	if !strings.Contains(string(b), `"policies":{"llm-d":`) || !strings.Contains(string(b), `"sends_responses":true`) {
		t.Fatalf("results.json keys: %s", b)
	}
	// A chat scenario: no label.
	r = peerRun(rows[2:]...)
	r.Labels = policyLabels(r)
	if r.Labels != nil || strings.Contains(Table(r), "given tokens") {
		t.Fatalf("chat-only labels %v", r.Labels)
	}
}

// TestTableAdmission: with admission on, each policy's 429s are in
// results.json and in a column of the tables; off, there is no column
// and the table says nothing is refused.
func TestTableAdmission(t *testing.T) {
	r := peerRun(row{"dynamo", 0.4, 250, 450}, row{"precise", 0.6, 150, 400})
	r.VsBestPeer = ComparePeers(r)
	if table := Table(r); strings.Contains(table, "429") || strings.Contains(table, "admission") {
		t.Fatalf("admission off, yet:\n%s", table)
	}
	r.Admission = true
	n, m := 7, 0
	r.Policies["dynamo"].Shed429, r.Policies["precise"].Shed429 = &n, &m
	table := Table(r)
	lines := strings.Split(table, "\n")
	var head, dyn, peerDyn string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "policy ") && strings.Contains(l, "requests"):
			head = l
		case strings.HasPrefix(l, "dynamo ") && strings.Contains(l, "ms"):
			dyn = l
		case strings.HasPrefix(l, "dynamo ") && strings.Contains(l, "×"):
			peerDyn = l
		}
	}
	if !strings.HasSuffix(head, "   429") || !strings.HasSuffix(dyn, "      7") || !strings.HasSuffix(peerDyn, "      7") ||
		!strings.Contains(table, "admission control on") {
		t.Fatalf("429 columns:\n%s", table)
	}
	b, _ := json.Marshal(r)
	if !strings.Contains(string(b), `"shed_429":7`) || !strings.Contains(string(b), `"shed_429":0`) || !strings.Contains(string(b), `"admission":true`) {
		t.Fatalf("results.json: %s", b)
	}
	var page bytes.Buffer
	if err := WriteReport(&page, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "<th>429</th>") || !strings.Contains(page.String(), "<td>7</td>") {
		t.Fatal("the report lacks the 429 column")
	}
	if s := shed429([]Outcome{{Status: 429}, {Status: 200}, {Status: 429, Err: errors.New("x")}, {Status: 503}}); s == nil || *s != 2 {
		t.Fatalf("shed429 %v", s)
	}
}

// TestCalibrationTable: the measured peak and τ are in summary.txt and
// results.json beside the guide's.
func TestCalibrationTable(t *testing.T) {
	r := peerRun(row{"llm-d", 0.3, 100, 900}, row{"llm-d-calibrated", 0.5, 200, 500})
	r.Labels = policyLabels(r)
	r.Policies["llm-d-calibrated"].LLMDCalibration = &LLMDCalibration{ChunkTokens: 8192, Warmup: 5, TTFTms: make([]float64, 20),
		MedianTTFTms: 844, PeakPrefillThroughput: 9706, MaxTTFTPenaltySeconds: 18, TauTokens: 174708}
	table := Table(r)
	for _, want := range []string{"llm-d-calibrated: 9706 tokens/s", "20 probes of 8192 random token ids after 5 warm-up, median TTFT 844 ms",
		"τ = 174708 tokens", "llm-d (default): the guide's 15928 tokens/s", "τ = 286704 tokens"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	b, _ := json.Marshal(r)
	if !strings.Contains(string(b), `"llm_d_calibration":{"chunk_tokens":8192,"warmup":5,`) || !strings.Contains(string(b), `"peak_prefill_throughput":9706`) {
		t.Fatalf("%s", b)
	}
}

// TestPeerCalibratedRun runs llm-d-calibrated and llm-d-precise on a
// small Responses scenario: the calibrated run measured its engines'
// peak by llm-d's recipe (20 TTFTs after 5 warm-ups; the simulated
// engine prefills about 10k tokens/s, 25 ms a step besides, so the peak
// is at most ≈ 9.7k; a loaded machine, whose wall-clock delays count at
// time scale 0.1, only lowers it) and ran;
// llm-d-precise is labelled as given tokens; admission was off, so no
// 429 column.
func TestPeerCalibratedRun(t *testing.T) {
	res, err := Run(context.Background(), Options{Scenario: SeedContinuation{Conversations: 2, OutputTokens: 4},
		Policies: []score.Policy{score.LLMDPrecise, LLMDCalibrated}, GPUBlocks: 1024, TimeScale: 0.1, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", Table(res))
	cal := res.Policies["llm-d-calibrated"]
	if cal == nil || cal.Errors != 0 || cal.Requests != 4 || cal.LLMDCalibration == nil {
		t.Fatalf("llm-d-calibrated: %+v", cal)
	}
	c := cal.LLMDCalibration
	if c.ChunkTokens != 8192 || c.Warmup != 5 || len(c.TTFTms) != 20 || c.MaxTTFTPenaltySeconds != 18 ||
		c.PeakPrefillThroughput <= 0 || c.PeakPrefillThroughput > 11000 || c.TauTokens != 18*c.PeakPrefillThroughput {
		t.Fatalf("calibration %+v", c)
	}
	if res.Policies["llm-d-precise"].LLMDCalibration != nil || cal.Shed429 != nil || res.Admission {
		t.Fatalf("results: %+v", res)
	}
	if !res.SendsResponses || res.Label("llm-d-precise") != "llm-d-precise (given tokens)" || res.VsBestPeer == nil {
		t.Fatalf("labels %v, comparison %+v", res.Labels, res.VsBestPeer)
	}
	if table := Table(res); !strings.Contains(table, "llm-d-precise (given tokens)") || !strings.Contains(table, "llm-d-calibrated: ") {
		t.Fatalf("table:\n%s", table)
	}
}
