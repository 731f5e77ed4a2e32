package peers_test

import (
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/peers"
)

// requestIDs are n request ids as the picker makes them (peerRequestID:
// a seeded draw, in hex).
func requestIDs(n int, seed uint64) []string {
	r := peers.NewRand(seed)
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.FormatUint(r.Uint64(), 16)
	}
	return out
}

// TestP2PSpread: the coordinate is FNV-32a of the id over 2^32 (the
// published FNV-1a values of "" and "a").
func TestP2PSpread(t *testing.T) {
	for _, tc := range []struct {
		id   string
		hash uint32
	}{{"", 0x811c9dc5}, {"a", 0xe40c292c}, {"foobar", 0xbf9cf968}} {
		if got, want := peers.P2PSpread(tc.id), float64(tc.hash)/(1<<32); got != want {
			t.Errorf("P2PSpread(%q) = %v, want %v", tc.id, got, want)
		}
	}
}

// TestP2PSample: the candidates are the endpoints holding something and
// within one block of the best; they are drawn in proportion to
// 1/(1 + waiting), the same one for the same request id.
func TestP2PSample(t *testing.T) {
	ep := func(id string, source int, waiting float64) peers.P2PEndpoint {
		return peers.P2PEndpoint{ID: id, Source: source, Local: source, BlockSize: 16, Waiting: waiting}
	}
	ids := requestIDs(40000, 1)
	cases := []struct {
		name  string
		eps   []peers.P2PEndpoint
		share map[string]float64 // the expected share of each sampled ID; none: -1 always
	}{
		{"nobody holds anything", []peers.P2PEndpoint{ep("a", 0, 0), ep("b", 0, 0)}, nil},
		{"one holder", []peers.P2PEndpoint{ep("a", 0, 0), ep("b", 64, 9)}, map[string]float64{"b": 1}},
		{"within one block of the best, not beyond", []peers.P2PEndpoint{
			ep("a", 4096, 0), ep("b", 4080, 0), ep("c", 4079, 0), ep("d", 0, 0)},
			map[string]float64{"a": 0.5, "b": 0.5}},
		{"3 waiting: a quarter of an idle one's weight", []peers.P2PEndpoint{ep("idle", 2048, 0), ep("busy", 2048, 3)},
			map[string]float64{"idle": 0.8, "busy": 0.2}},
		{"1/(1+w) over three", []peers.P2PEndpoint{ep("a", 512, 0), ep("b", 512, 1), ep("c", 500, 2)},
			map[string]float64{"a": 1 / (1 + 0.5 + 1.0/3), "b": 0.5 / (1 + 0.5 + 1.0/3), "c": (1.0 / 3) / (1 + 0.5 + 1.0/3)}},
		{"no metric (NaN) or a negative one counts as idle", []peers.P2PEndpoint{ep("a", 512, math.NaN()), ep("b", 512, -4)},
			map[string]float64{"a": 0.5, "b": 0.5}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			counts := map[string]int{}
			for _, id := range ids {
				i := peers.P2PSample(id, tc.eps)
				if i != peers.P2PSample(id, tc.eps) {
					t.Fatalf("id %s: two draws differ", id)
				}
				if i < 0 {
					counts[""]++
					continue
				}
				counts[tc.eps[i].ID]++
			}
			if tc.share == nil {
				if counts[""] != len(ids) {
					t.Fatalf("sampled %v, want none", counts)
				}
				return
			}
			for id, n := range counts {
				want, ok := tc.share[id]
				got := float64(n) / float64(len(ids))
				if !ok || math.Abs(got-want) > 0.01 {
					t.Errorf("%q sampled %.4f of the time, want %.4f", id, got, want)
				}
			}
		})
	}
	// The walk is in the endpoints' order: the same id, the order
	// reversed, lands on the other of two equal weights unless it sits
	// exactly at the middle.
	eps := []peers.P2PEndpoint{ep("a", 64, 0), ep("b", 64, 0)}
	for _, id := range ids[:100] {
		want := "a"
		if peers.P2PSpread(id) >= 0.5 {
			want = "b"
		}
		if got := eps[peers.P2PSample(id, eps)].ID; got != want {
			t.Fatalf("id %s (coordinate %v): %s, want %s", id, peers.P2PSpread(id), got, want)
		}
	}
}

// TestP2PName: the sampled source is named only when it is not the
// computing endpoint and holds at least the threshold more than the
// computing endpoint holds locally (any tier).
func TestP2PName(t *testing.T) {
	eps := []peers.P2PEndpoint{
		{ID: "src", Source: 4096, Local: 4096, BlockSize: 16},
		{ID: "gpu", Source: 0, Local: 2048, BlockSize: 16}, // holds 2,048 on GPU, nothing on CPU
		{ID: "cold", BlockSize: 16},
		{ID: "odd", Source: 4096, Local: 0, BlockSize: 16}, // counts no data source gives: only the ID check stops it
	}
	cases := []struct {
		name      string
		delta     int
		sampled   int
		computing string
		want      string
	}{
		{"exactly the threshold beyond", 2048, 0, "gpu", "src"},
		{"one token short", 2049, 0, "gpu", ""},
		{"a cold computing endpoint", 4096, 0, "cold", "src"},
		{"a computing endpoint not among them holds 0", 4096, 0, "elsewhere", "src"},
		{"never the computing endpoint", 1, 0, "src", ""},
		{"never the computing endpoint, whatever the counts", 1, 3, "odd", ""},
		{"nothing sampled", 1, -1, "cold", ""},
	}
	for _, tc := range cases {
		c := peers.P2PSourceConfig{MinCachedTokenDelta: tc.delta}
		if got := c.Name(eps, tc.sampled, tc.computing); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestP2PCounts: per-tier data counts a source's CPU-tier run only and the
// computing endpoint's longest run on any tier; tierless data counts all
// it matched for both; unhealthy candidates are left out.
func TestP2PCounts(t *testing.T) {
	c := func(id string, healthy bool, gpu, cpu, storage int, waiting float64) peers.Candidate {
		x := peers.Candidate{ID: id, Healthy: healthy, Waiting: waiting}
		x.Matched[tier.GPU], x.Matched[tier.CPU], x.Matched[tier.Storage] = gpu, cpu, storage
		return x
	}
	cands := []peers.Candidate{c("a", true, 10, 4, 12, 2), c("down", false, 0, 50, 0, 0), c("b", true, 0, 6, 0, 0)}
	got := peers.P2PPerTier(cands, 16)
	want := []peers.P2PEndpoint{{ID: "a", Source: 64, Local: 192, BlockSize: 16, Waiting: 2}, {ID: "b", Source: 96, Local: 96, BlockSize: 16}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("per tier: %+v, want %+v", got, want)
	}
	got = peers.P2PTierless(cands, map[string]int{"a": 3, "down": 9}, 64)
	want = []peers.P2PEndpoint{{ID: "a", Source: 192, Local: 192, BlockSize: 64, Waiting: 2}, {ID: "b", BlockSize: 64}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("tierless: %+v, want %+v", got, want)
	}
	// a's long GPU run makes it no source with per-tier data: its CPU run,
	// 4 blocks, is more than one block short of b's 6, so b is the only
	// candidate.
	for _, id := range requestIDs(200, 2) {
		if i := peers.P2PSample(id, peers.P2PPerTier(cands, 16)); i != 1 {
			t.Fatalf("id %s sampled %d, want b", id, i)
		}
	}
}

// TestP2PSourceConfig: the threshold must be at least 1; each arm's
// default is its guide's.
func TestP2PSourceConfig(t *testing.T) {
	if peers.DefaultP2PSourceConfig().MinCachedTokenDelta != 1 || peers.DefaultP2PSourceConfig().Validate() != nil {
		t.Fatal("the producer's default is 1")
	}
	for _, n := range []int{0, -1} {
		if (peers.P2PSourceConfig{MinCachedTokenDelta: n}).Validate() == nil {
			t.Errorf("MinCachedTokenDelta %d accepted", n)
		}
	}
	defaults := []struct {
		name  string
		delta int
		err   error
	}{
		{peers.LLMDPreciseP2P, peers.DefaultLLMDPreciseP2PConfig().Source.MinCachedTokenDelta, peers.DefaultLLMDPreciseP2PConfig().Validate()},
		{peers.LLMDP2P, peers.DefaultLLMDP2PConfig().Source.MinCachedTokenDelta, peers.DefaultLLMDP2PConfig().Validate()},
		{peers.LLMDLoadP2P, peers.DefaultLLMDLoadP2PConfig().Source.MinCachedTokenDelta, peers.DefaultLLMDLoadP2PConfig().Validate()},
	}
	want := map[string]int{peers.LLMDPreciseP2P: 2048, peers.LLMDP2P: 1, peers.LLMDLoadP2P: 2048}
	for _, d := range defaults {
		if d.delta != want[d.name] || d.err != nil {
			t.Errorf("%s: default delta %d (%v), want %d", d.name, d.delta, d.err, want[d.name])
		}
	}
	if c := peers.DefaultLLMDLoadConfig(); c.QueueWeight != 3 || c.KVUtilizationWeight != 2 || c.Validate() != nil {
		t.Errorf("llm-d-load default %+v: want queue 3, KV utilization 2", c)
	}
	if peers.DefaultDynamoHintConfig().Validate() != nil {
		t.Error("dynamo+hint's default refused")
	}
	bad := map[string]error{
		"precise arm, delta 0": func() error {
			c := peers.DefaultLLMDPreciseP2PConfig()
			c.Source.MinCachedTokenDelta = 0
			_, err := peers.NewLLMDPreciseP2P(c)
			return err
		}(),
		"llm-d arm, placement invalid": func() error {
			c := peers.DefaultLLMDP2PConfig()
			c.Placement.LRUCapacity = 0
			_, err := peers.NewLLMDP2P(c)
			return err
		}(),
		"load arm, delta 0": func() error {
			_, err := peers.NewLLMDLoadP2P(peers.LLMDLoadP2PConfig{Placement: peers.DefaultLLMDLoadConfig()})
			return err
		}(),
		"load, no weight": func() error { _, err := peers.NewLLMDLoad(peers.LLMDLoadConfig{}); return err }(),
		"load, a negative": func() error {
			_, err := peers.NewLLMDLoad(peers.LLMDLoadConfig{QueueWeight: -1, KVUtilizationWeight: 2})
			return err
		}(),
		"dynamo arm, zero": func() error { _, err := peers.NewDynamoHint(peers.DynamoHintConfig{}); return err }(),
	}
	for name, err := range bad {
		if err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// TestCalibratedMinCachedTokenDelta: llm-d's ladder — the smallest length
// whose median pull beats its median recompute with bytes moved; errors
// when no pull fired, a control moved bytes, or nothing won.
func TestCalibratedMinCachedTokenDelta(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x * float64(time.Millisecond))
		}
		return out
	}
	probe := func(tokens int, rec, pull []time.Duration, pulled ...float64) peers.P2PProbe {
		return peers.P2PProbe{Tokens: tokens, Recompute: rec, Pull: pull, RecomputeBytes: make([]float64, len(rec)), PullBytes: pulled}
	}
	moved := []float64{1e6, 1e6, 1e6}
	cases := []struct {
		name   string
		probes []peers.P2PProbe
		want   int
		err    error
	}{
		{"the crossover at 16K", []peers.P2PProbe{
			probe(2048, ms(100, 101, 99), ms(150, 140, 160), moved...),
			probe(8192, ms(300, 310, 290), ms(320, 305, 330), moved...),
			probe(16384, ms(700, 690, 710), ms(500, 520, 480), moved...),
			probe(32768, ms(1500, 1500, 1500), ms(800, 800, 800), moved...),
		}, 16384, nil},
		{"the smallest winner, whatever the order", []peers.P2PProbe{
			probe(49152, ms(2000), ms(900), 1),
			probe(8192, ms(300), ms(200), 1),
			probe(32768, ms(1500), ms(800), 1),
		}, 8192, nil},
		{"a median, not one fast pull", []peers.P2PProbe{
			probe(2048, ms(100, 100, 100), ms(10, 200, 200), moved...),
			probe(8192, ms(300, 300, 300), ms(200, 200, 400), moved...),
		}, 8192, nil},
		{"a faster length whose pulls moved nothing does not win", []peers.P2PProbe{
			probe(2048, ms(100), ms(50), 0),
			probe(8192, ms(300), ms(200), 1e6),
		}, 8192, nil},
		{"an even count's median is the middle two's mean", []peers.P2PProbe{
			probe(2048, ms(100, 100), ms(99, 102), 0, 1e6), // pulled median 5e5 > 0; pull median 100.5 > 100
			probe(8192, ms(300, 300), ms(100, 100), 1e6, 1e6),
		}, 8192, nil},
		{"no pull ever fired", []peers.P2PProbe{probe(2048, ms(100), ms(50), 0), probe(8192, ms(300), ms(200), 0)}, 0, peers.ErrP2PNoPull},
		{"a control moved bytes", []peers.P2PProbe{{Tokens: 2048, Recompute: ms(100), Pull: ms(50), RecomputeBytes: []float64{4096}, PullBytes: []float64{1e6}}}, 0, peers.ErrP2PContaminated},
		{"the pull never wins", []peers.P2PProbe{probe(2048, ms(100), ms(150), 1), probe(49152, ms(2000), ms(2100), 1)}, 0, peers.ErrP2PNoCrossover},
		{"nothing measured", nil, 0, peers.ErrP2PNoPull},
	}
	for _, tc := range cases {
		got, err := peers.CalibratedMinCachedTokenDelta(tc.probes)
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("%s: %d, %v; want %d, %v", tc.name, got, err, tc.want, tc.err)
		}
	}
	if want := []int{2048, 8192, 16384, 32768, 49152}; len(peers.P2PCalibrationLengths()) != len(want) || peers.P2PCalibrationReps != 5 {
		t.Fatalf("the ladder changed: %v × %d", peers.P2PCalibrationLengths(), peers.P2PCalibrationReps)
	} else {
		for i := range want {
			if peers.P2PCalibrationLengths()[i] != want[i] {
				t.Fatalf("the ladder changed: %v", peers.P2PCalibrationLengths())
			}
		}
	}
}
