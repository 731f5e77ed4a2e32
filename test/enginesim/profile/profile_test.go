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
		{func(p *profile.Profile) { p.KVBytesPerToken = 0 }, "KV bytes per token"},
		{func(p *profile.Profile) { p.KVBytesPerToken = math.NaN() }, "KV bytes per token"},
		{func(p *profile.Profile) { p.H2DBytesPerSecond = 0 }, "host-to-device"},
		{func(p *profile.Profile) { p.H2DBytesPerSecond = math.Inf(1) }, "host-to-device"},
		{func(p *profile.Profile) { p.PullSetup = -1 }, "pull setup"},
		{func(p *profile.Profile) { p.PullBytesPerSecond = -1 }, "pull bandwidth"},
		{func(p *profile.Profile) { p.PullConnect = -time.Second }, "connection setup"},
		{func(p *profile.Profile) { p.CPUBytes = -1 }, "CPU tier"},
	} {
		p := named(t, profile.GPTOSS120BH200)
		c.breakIt(&p)
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error about %s, got %v", c.want, err)
		}
	}
}

// TestTransferConstants: each profile's KV, host-to-device, pull and CPU
// tier constants are the published (or stated) ones, and sim-default's
// are the assumed 8B-class ones with no CPU tier.
func TestTransferConstants(t *testing.T) {
	for _, c := range []struct {
		profile        string
		bytesPerToken  float64
		h2d            float64
		setup, connect time.Duration
		bandwidth      float64
		cpuBytes       int64
	}{
		{profile.SimDefault, 131_072, 50e9, time.Millisecond, 0, 40e9, 0},
		{profile.GPTOSS120BH200, 41_500, 50e9, time.Millisecond, 0, 41_500 / 10.6e-6, 88 << 30},
		{profile.Qwen332BH100TP2, 262_144, 50e9, time.Millisecond, 0, 40e9, 0},
		{profile.GLM52Rank, 93_000, 50e9, 1250 * time.Millisecond, 6 * time.Second, 4.5e9, 100 << 30},
	} {
		p := named(t, c.profile)
		if p.KVBytesPerToken != c.bytesPerToken || p.H2DBytesPerSecond != c.h2d || p.PullSetup != c.setup ||
			p.PullConnect != c.connect || p.PullBytesPerSecond != c.bandwidth || p.CPUBytes != c.cpuBytes {
			t.Errorf("%s: %v B/token, H2D %v, pull %v + %v B/s (connect %v), CPU %d", c.profile, p.KVBytesPerToken,
				p.H2DBytesPerSecond, p.PullSetup, p.PullBytesPerSecond, p.PullConnect, p.CPUBytes)
		}
	}
}

// TestTransferHelpers: LoadBack, PullTime and CPUBlocks by their
// formulas, on values worked by hand.
func TestTransferHelpers(t *testing.T) {
	gpt := named(t, profile.GPTOSS120BH200)
	glm := named(t, profile.GLM52Rank)
	sim := profile.Default()
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		// 1,000 × 131,072 B at 50 GB/s = 2.62144 ms.
		{"sim-default load-back of 1,000 tokens", sim.LoadBack(1000), 2_621_440 * time.Nanosecond},
		{"no load-back of nothing", sim.LoadBack(0), 0},
		// 1,000 × 41,500 B at 50 GB/s = 830 µs.
		{"gpt-oss load-back of 1,000 tokens", gpt.LoadBack(1000), 830 * time.Microsecond},
		// 1 ms + 2,048 × 10.6 µs = 22.7088 ms (the report's slope; its
		// intercept is the engine's own steps).
		{"gpt-oss pull of 2,048", gpt.PullTime(2048, 1, false), 22_708_800 * time.Nanosecond},
		{"gpt-oss pull of 49,152", gpt.PullTime(49152, 1, false), 522_011_200 * time.Nanosecond},
		// Shared by three: the bytes take three times as long.
		{"gpt-oss pull of 2,048 shared by 3", gpt.PullTime(2048, 3, false), time.Millisecond + 3*21_708_800*time.Nanosecond},
		{"a share below 1 counts as 1", gpt.PullTime(2048, 0, false), gpt.PullTime(2048, 1, false)},
		{"connect is free on gpt-oss", gpt.PullTime(2048, 1, true), gpt.PullTime(2048, 1, false)},
		// 1.25 s + 6 s + 45,000 × 93,000 B / 4.5 GB/s = 8.18 s.
		{"glm first pull of 45,000", glm.PullTime(45_000, 1, true), 8180 * time.Millisecond},
		{"glm warmed pull of 45,000", glm.PullTime(45_000, 1, false), 2180 * time.Millisecond},
		{"no pull of nothing", glm.PullTime(0, 2, true), 0},
	} {
		if d := c.got - c.want; d < -time.Nanosecond || d > time.Nanosecond {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	for _, c := range []struct {
		name      string
		got, want int
	}{
		// 88 GiB / (41,500 B × 16) = 142,303 blocks (≈2.28M tokens, kv-transfer.md §1.1's 1.8× the GPU).
		{"gpt-oss CPU tier in blocks of 16", gpt.CPUBlocks(gpt.CPUBytes, 16), 142_303},
		{"in blocks of 64", gpt.CPUBlocks(gpt.CPUBytes, 64), 35_575},
		// 100 GiB / (93,000 B × 16) = 72,160.
		{"glm CPU tier", glm.CPUBlocks(glm.CPUBytes, 16), 72_160},
		{"no bytes", sim.CPUBlocks(sim.CPUBytes, 16), 0},
		{"no block size", gpt.CPUBlocks(gpt.CPUBytes, 0), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
}

// crossover is the smallest prompt length (in tokens) from which pulling
// it is faster than computing it, -1 if none up to 1M.
func crossover(compute func(int) time.Duration, pull func(int) time.Duration) int {
	for n := 1; n <= 1<<20; n++ {
		if pull(n) < compute(n) {
			return n
		}
	}
	return -1
}

// TestPullCrossovers: the lengths below which a pull loses, as the
// profiles' doc comments state them. glm52-rank: ≈12K against its own
// single-request prefill; calibrate_work_boundary.py's 8.6K is against
// the loaded 3,585 tok/s with a 134 µs/token slope (kv-transfer.md §6),
// and this profile's 4.5 GB/s wins from ≈4.8K against that loaded rate.
// gptoss120b-h200: pulls win at every length (engine-profiles.md §8).
func TestPullCrossovers(t *testing.T) {
	glm := named(t, profile.GLM52Rank)
	gpt := named(t, profile.GPTOSS120BH200)
	warmed := func(p profile.Profile) func(int) time.Duration {
		return func(n int) time.Duration { return p.PullTime(n, 1, false) }
	}
	loaded := func(n int) time.Duration { return time.Duration(float64(n) / 3585 * float64(time.Second)) }
	boundary := func(n int) time.Duration {
		return 1250*time.Millisecond + time.Duration(float64(n)*134e-6*float64(time.Second))
	}
	for _, c := range []struct {
		name string
		got  int
		want int
	}{
		{"glm52-rank against its single-request prefill", crossover(glm.ColdPrefill, warmed(glm)), 12_017},
		{"calibrate_work_boundary.py against 3,585 tok/s", crossover(loaded, boundary), 8_625},
		{"glm52-rank against 3,585 tok/s", crossover(loaded, warmed(glm)), 4_840},
		{"gptoss120b-h200 against its prefill", crossover(gpt.ColdPrefill, warmed(gpt)), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s: pulls win from %d tokens, want %d", c.name, c.got, c.want)
		}
	}
	// The first pull between a pair pays 6 s more: it loses far longer.
	if first := crossover(glm.ColdPrefill, func(n int) time.Duration { return glm.PullTime(n, 1, true) }); first < 50_000 {
		t.Errorf("glm52-rank's first pull wins from %d tokens: the connection cost is not paid", first)
	}
}
