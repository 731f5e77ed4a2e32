package profile_test

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/profile"
)

func named(t *testing.T, name string) profile.Profile {
	t.Helper()
	p, err := profile.Named(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestColdPrefillMatchesPublishedRows: each calibrated profile's lone cold
// request, summed over its chunks, is within the stated tolerance of the
// published single-request figures it was fitted to.
func TestColdPrefillMatchesPublishedRows(t *testing.T) {
	for _, c := range []struct {
		profile string
		tokens  int
		ms      float64 // published
		tol     float64 // relative
	}{
		// engine-profiles.md §3, gpt-oss-120b-h200.md@067fe1b medians.
		{profile.GPTOSS120BH200, 2048, 70.6, 0.02},
		{profile.GPTOSS120BH200, 8192, 205.4, 0.02},
		{profile.GPTOSS120BH200, 16384, 426.3, 0.02},
		{profile.GPTOSS120BH200, 32768, 983.0, 0.02},
		{profile.GPTOSS120BH200, 49152, 1695, 0.02},
		// §2/§3, the sticky blog: T(8192) = 0.40 s.
		{profile.Qwen332BH100TP2, 8192, 400, 0.005},
		// §3, glm-5.2-h200.md@01cac34.
		{profile.GLM52Rank, 8070, 1000, 0.01},
		{profile.GLM52Rank, 98220, 13750, 0.01},
	} {
		p := named(t, c.profile)
		got := float64(p.ColdPrefill(c.tokens)) / float64(time.Millisecond)
		if err := math.Abs(got-c.ms) / c.ms; err > c.tol {
			t.Errorf("%s at %d tokens: %.1f ms, published %.1f ms: off by %.2f%% (tolerance %.1f%%)", c.profile, c.tokens, got, c.ms, 100*err, 100*c.tol)
		}
	}
}

// oldStep is the engine's step duration before profiles, verbatim.
func oldStep(prefill, decodes int) time.Duration {
	return 25*time.Millisecond + time.Duration(decodes)*(100*time.Microsecond) +
		time.Duration(float64(prefill)/10_000*float64(time.Second))
}

// TestSimDefaultIsTheOldModel: sim-default prices every step exactly as
// the engine did before profiles, whatever the chunks' offsets and the
// decodes' contexts, and keeps the old sizes.
func TestSimDefaultIsTheOldModel(t *testing.T) {
	p := profile.Default()
	if named(t, profile.SimDefault).Name != p.Name || p.MaxNumBatchedTokens != 8192 || p.BlockSize != 16 || p.NumGPUBlocks != 8192 || p.MaxModelLen != 32768 {
		t.Fatalf("sim-default: %+v", p)
	}
	for prefill := 0; prefill <= 20_000; prefill += 7 {
		for _, decodes := range []int{0, 1, 3, 50, 256} {
			// The prefill split in up to three chunks at arbitrary offsets.
			a, b := prefill/3, prefill/5
			chunks := []profile.Chunk{{Offset: 0, Tokens: a}, {Offset: 1000 + prefill, Tokens: b}, {Offset: 17, Tokens: prefill - a - b}}
			if got, want := p.StepCost(chunks, decodes, 12345*decodes), oldStep(prefill, decodes); got != want {
				t.Fatalf("%d prefill tokens, %d decodes: %v, want %v", prefill, decodes, got, want)
			}
		}
		if got, want := p.ChunkCost(prefill, prefill), oldStep(prefill, 0)-25*time.Millisecond; got != want {
			t.Fatalf("chunk of %d: %v, want %v", prefill, got, want)
		}
	}
	if got, want := p.ColdPrefill(8192), 25*time.Millisecond+819200*time.Microsecond; got != want {
		t.Fatalf("an 8,192-token request: %v, want %v", got, want)
	}
}

// TestChunksSumToTheQuadratic: however a request is chunked, its chunks
// cost b·t + c·t² in all (to the rounding of each chunk), and a later
// chunk of the same size costs more.
func TestChunksSumToTheQuadratic(t *testing.T) {
	p := named(t, profile.GPTOSS120BH200)
	for _, tokens := range []int{1, 100, 8192, 49152, 100_000} {
		want := float64(tokens)/p.PrefillTokensPerSecond + p.PrefillQuadratic*float64(tokens)*float64(tokens)
		for _, chunk := range []int{1000, 2048, 8192, 1 << 20} {
			var sum time.Duration
			n := 0
			for s := 0; s < tokens; s += chunk {
				sum += p.ChunkCost(s, min(chunk, tokens-s))
				n++
			}
			if d := math.Abs(sum.Seconds() - want); d > float64(n)*1e-9 {
				t.Errorf("%d tokens in chunks of %d: %v, want %.9fs", tokens, chunk, sum, want)
			}
		}
	}
	if first, later := p.ChunkCost(0, 8192), p.ChunkCost(40960, 8192); later <= first {
		t.Errorf("a chunk at offset 40960 costs %v, not more than at 0 (%v)", later, first)
	}
	if p.ChunkCost(100, 0) != 0 || p.ChunkCost(100, -5) != 0 {
		t.Error("an empty chunk costs something")
	}
}

// TestDecodeCostGrows: a decode step costs more with every sequence, and
// (in the profiles with a KV term) with every thousand context tokens.
func TestDecodeCostGrows(t *testing.T) {
	for _, name := range profile.Names() {
		p := named(t, name)
		for seqs := 0; seqs < 300; seqs += 10 {
			if a, b := p.DecodeCost(seqs, 10_000), p.DecodeCost(seqs+1, 10_000); b <= a {
				t.Errorf("%s: %d sequences cost %v, %d cost %v", name, seqs, a, seqs+1, b)
			}
			if a, b := p.DecodeCost(seqs, 100_000), p.DecodeCost(seqs, 101_000); b < a || name != profile.SimDefault && b <= a {
				t.Errorf("%s: 100,000 KV tokens cost %v, 101,000 cost %v", name, a, b)
			}
		}
		if got, want := p.StepCost(nil, 4, 5000), p.StepBase+p.DecodeCost(4, 5000); got != want {
			t.Errorf("%s: a decode step costs %v, want the base plus the decodes, %v", name, got, want)
		}
	}
}

// TestNamed: the names, sim-default first; every named profile is valid,
// cites its sources, states what is not calibrated (sim-default included:
// all of it), and comes as a copy; an unknown name is an error listing the
// names.
func TestNamed(t *testing.T) {
	names := profile.Names()
	want := []string{profile.SimDefault, profile.GPTOSS120BH200, profile.Qwen332BH100TP2, profile.GLM52Rank}
	if !slices.Equal(names, want) {
		t.Fatalf("names %q, want %q", names, want)
	}
	for _, name := range names {
		p := named(t, name)
		if err := p.Validate(); err != nil || p.Name != name || len(p.Sources) == 0 || len(p.Uncalibrated) == 0 {
			t.Errorf("%s: %v, %+v", name, err, p)
		}
		for _, s := range p.Sources {
			if !strings.Contains(s, "engine-profiles.md §") {
				t.Errorf("%s: source %q names no section of engine-profiles.md", name, s)
			}
		}
		if p.BlocksAt(p.BlockSize) != p.NumGPUBlocks || p.BlocksAt(2*p.BlockSize) != p.NumGPUBlocks/2 || p.KVTokens() != p.NumGPUBlocks*p.BlockSize {
			t.Errorf("%s: capacity %d at %d, %d at %d", name, p.BlocksAt(p.BlockSize), p.BlockSize, p.BlocksAt(2*p.BlockSize), 2*p.BlockSize)
		}
		p.Sources[0], p.StepBase = "changed", time.Hour
		if again := named(t, name); again.Sources[0] == "changed" || again.StepBase == time.Hour {
			t.Errorf("%s: a change to a returned profile reached the table", name)
		}
	}
	_, err := profile.Named("gptoss120b-h100")
	if err == nil {
		t.Fatal("an unknown name was accepted")
	}
	for _, name := range append(names, "gptoss120b-h100") {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the error %q does not name %s", err, name)
		}
	}
}

// TestValidate: each broken constant is refused, with its name.
func TestValidate(t *testing.T) {
	for _, c := range []struct {
		breakIt func(*profile.Profile)
		want    string
	}{
		{func(p *profile.Profile) { p.Name = "" }, "no name"},
		{func(p *profile.Profile) { p.StepBase = -1 }, "step base"},
		{func(p *profile.Profile) { p.PrefillTokensPerSecond = 0 }, "prefill throughput"},
		{func(p *profile.Profile) { p.PrefillTokensPerSecond = math.Inf(1) }, "prefill throughput"},
		{func(p *profile.Profile) { p.PrefillQuadratic = -1e-9 }, "quadratic"},
		{func(p *profile.Profile) { p.PrefillQuadratic = math.NaN() }, "quadratic"},
		{func(p *profile.Profile) { p.DecodePerSeq = -time.Millisecond }, "per sequence"},
		{func(p *profile.Profile) { p.DecodePerKVToken = -1 }, "per KV token"},
		{func(p *profile.Profile) { p.MaxNumBatchedTokens = 0 }, "max_num_batched_tokens"},
		{func(p *profile.Profile) { p.NumGPUBlocks = 1 }, "capacity"},
		{func(p *profile.Profile) { p.BlockSize = 0 }, "capacity"},
		{func(p *profile.Profile) { p.MaxModelLen = 0 }, "max_model_len"},
	} {
		p := named(t, profile.GPTOSS120BH200)
		c.breakIt(&p)
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error about %s, got %v", c.want, err)
		}
	}
}
