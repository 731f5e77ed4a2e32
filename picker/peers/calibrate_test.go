package peers_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/peers"
)

// TestCalibratedPeak: llm-d's recipe, peak = CHUNK ÷ median TTFT, the
// median of an even count the mean of the middle two, truncated to whole
// tokens per second; 0 when undefined.
func TestCalibratedPeak(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x * float64(time.Millisecond))
		}
		return out
	}
	cases := []struct {
		name   string
		chunk  int
		ttfts  []time.Duration
		median time.Duration
		want   float64
	}{
		{"one sample", 8192, ms(844), 844 * time.Millisecond, 9706},                                        // 8192 / 0.844 = 9706.16
		{"odd count: the middle one", 8192, ms(900, 800, 2000), 900 * time.Millisecond, 9102},              // 9102.2
		{"even count: the middle two's mean", 8192, ms(1000, 500, 800, 900), 850 * time.Millisecond, 9637}, // 9637.6
		{"an outlier does not move it", 1000, ms(100, 100, 100, 100, 60000), 100 * time.Millisecond, 10000},
		{"the guide's H100 figure", 8192, []time.Duration{514300 * time.Microsecond}, 514300 * time.Microsecond, 15928}, // 15928.4
		{"no samples", 8192, nil, 0, 0},
		{"no chunk", 0, ms(100), 100 * time.Millisecond, 0},
		{"a zero median", 8192, ms(0, 0, 5), 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tc.ttfts...)
			if got := peers.MedianDuration(tc.ttfts); got != tc.median {
				t.Errorf("median %v, want %v", got, tc.median)
			}
			if got := peers.CalibratedPeak(tc.chunk, tc.ttfts); got != tc.want {
				t.Errorf("peak %v, want %v", got, tc.want)
			}
			for i := range in {
				if in[i] != tc.ttfts[i] {
					t.Fatal("the TTFTs were reordered")
				}
			}
		})
	}
	// 20 measured of the recipe's 25: the 5 warm-ups are the caller's to
	// leave out.
	if peers.CalibrationWarmup != 5 || peers.CalibrationRequests != 20 || peers.CalibrationTMax != 18*time.Second {
		t.Fatal("the recipe's constants changed")
	}
}

// TestLLMDLoadGate: SetLoadGate sets the peak and the TTFT penalty the
// affinity filter's gate uses (τ = peak × penalty), keeps the state, and
// refuses values the config refuses; the defaults are the guide's.
func TestLLMDLoadGate(t *testing.T) {
	c := peers.DefaultLLMDConfig()
	if c.PeakPrefillThroughput != 15928 || c.MaxTTFTPenaltyMs != 18000 || c.MaxPrefixTokens != 40960 {
		t.Fatalf("defaults %+v: want the guide's peak 15928, 18 s and 40960 prefix tokens", c)
	}
	p, err := peers.NewLLMD(c)
	if err != nil {
		t.Fatal(err)
	}
	cands := []peers.Candidate{{ID: "a", Healthy: true}, {ID: "b", Healthy: true}}
	toks := func(n int, base uint32) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = base + uint32(i)
		}
		return out
	}
	sticky := &peers.Request{Model: "m", Tokens: toks(640, 1), BlockSize: 16, Stream: true}
	p.Dispatched(sticky, "a", time.Time{}) // a holds it: sticky
	// a's in-flight tokens: 640 + 10,048 (157 blocks of 64, the partial
	// last one in full; still before their first chunk).
	p.Dispatched(&peers.Request{Model: "m", Tokens: toks(10000, 1_000_000), BlockSize: 16, Stream: true}, "a", time.Time{})
	if got := p.InflightTokens("a"); got != 10688 {
		t.Fatalf("in flight %d, want 10688", got)
	}
	pick := func() string { return p.Pick(sticky, cands, 0, time.Time{}).Reason }
	if got := pick(); got != "sticky" {
		t.Fatalf("at the defaults (τ ≈ 286,704 tokens): %s, want sticky", got)
	}
	// τ = 1000 tok/s × 10 s = 10,000 < 10,688: the gate breaks.
	if err := p.SetLoadGate(1000, 10000); err != nil {
		t.Fatal(err)
	}
	if peak, ms := p.LoadGate(); peak != 1000 || ms != 10000 {
		t.Fatalf("LoadGate %v, %v after SetLoadGate(1000, 10000)", peak, ms)
	}
	if got := pick(); got != "gate_broken" {
		t.Fatalf("τ 10,000: %s, want gate_broken", got)
	}
	// τ = 1000 × 11 s = 11,000 > 10,688: sticky again; the state was kept.
	if err := p.SetLoadGate(1000, 11000); err != nil {
		t.Fatal(err)
	}
	if got := pick(); got != "sticky" {
		t.Fatalf("τ 11,000: %s, want sticky", got)
	}
	for _, bad := range [][2]float64{{0, 18000}, {-1, 18000}, {1000, -1}} {
		if err := p.SetLoadGate(bad[0], bad[1]); err == nil {
			t.Errorf("SetLoadGate(%v, %v) accepted", bad[0], bad[1])
		}
	}
	if got := pick(); got != "sticky" {
		t.Fatalf("a refused SetLoadGate changed the gate: %s", got)
	}
}
