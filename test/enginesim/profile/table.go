package profile

import (
	"fmt"
	"strings"
	"time"
)

// The named profiles.
const (
	SimDefault      = "sim-default"
	GPTOSS120BH200  = "gptoss120b-h200"
	Qwen332BH100TP2 = "qwen3-32b-h100-tp2"
	GLM52Rank       = "glm52-rank"
)

// table returns the named profiles, sim-default first, built afresh on
// every call (nothing is shared with a caller).
func table() []Profile {
	return []Profile{simDefault(), gptOSS120BH200(), qwen332BH100TP2(), glm52Rank()}
}

// Names lists the named profiles, sim-default first.
func Names() []string {
	var names []string
	for _, p := range table() {
		names = append(names, p.Name)
	}
	return names
}

// Named returns the profile called name.
func Named(name string) (Profile, error) {
	for _, p := range table() {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, fmt.Errorf("unknown engine profile %q: want one of %s", name, strings.Join(Names(), ", "))
}

// Default returns sim-default.
func Default() Profile { return simDefault() }

// simDefault is the engine's historical model, kept exactly so that every
// test and golden file written against it keeps its meaning: 25 ms a
// step, 0.1 ms per decoding sequence, prefill linear at 10,000 tok/s (an
// 8,192-token chunk takes 25 + 819.2 ms), 8,192 blocks of 16 tokens, a
// budget of 8,192 tokens and a context of 32,768. engine-profiles.md §3
// (last item) describes it; it is fitted to no row and, being linear,
// understates long-prefix costs against every one. Its KV and link
// constants (used only when a CPU tier or pulls are turned on, so that
// nothing of its past behaviour changes) are assumed: an 8B-class model at
// 128 KiB/token (engine-profiles.md §4: Llama-3.1-8B-class), PCIe Gen5 at
// ≈50 GB/s (§6), InfiniBand NDR at ≈40 GB/s with 1 ms of RDMA setup (§5),
// and no published CPU tier.
func simDefault() Profile {
	return Profile{
		Name: SimDefault,
		Sources: []string{
			"engine-profiles.md §3, last item: the simulated engine's model before profiles (25 ms a step, 0.1 ms per running sequence, 10,000 tok/s)",
			"engine-profiles.md §4–§6: 128 KiB/token for an 8B-class model; ≈50 GB/s PCIe Gen5 host-to-device; InfiniBand NDR ≈40 GB/s, RDMA setup 0.5–2 ms",
		},
		Uncalibrated: []string{
			"all of it: a synthetic model fitted to no published row, kept so that existing tests keep their meaning",
			"KV bytes per token: an 8B-class model assumed (131,072 B/token)",
			"host-to-device bandwidth: ≈50 GB/s PCIe Gen5 assumed (engine-profiles.md §6 is an inference)",
			"pulls: InfiniBand NDR ≈40 GB/s and 1 ms of setup assumed, no connection cost; no published pull row",
			"CPU tier: none published (0)",
		},
		StepBase:               25 * time.Millisecond,
		PrefillTokensPerSecond: 10_000,
		DecodePerSeq:           100 * time.Microsecond,
		MaxNumBatchedTokens:    8192,
		BlockSize:              16,
		NumGPUBlocks:           8192,
		MaxModelLen:            32768,
		KVBytesPerToken:        131_072,
		H2DBytesPerSecond:      50e9,
		PullSetup:              time.Millisecond,
		PullBytesPerSecond:     40e9,
	}
}

// gptOSS120BH200 is gpt-oss-120b on one H200 (TP=1), vLLM, chunk 8192.
//
// Prefill: fitted (minimax relative error) to the single cold request
// medians of engine-profiles.md §3 (gpt-oss-120b-h200.md@067fe1b): 70.6 /
// 205.4 / 426.3 / 983.0 / 1,695 ms at 2,048 / 8,192 / 16,384 / 32,768 /
// 49,152 tokens, summing the request's chunks of 8,192 tokens, each with
// the step base: a = 29.8 ms, b = 19.14 µs/token, c = 0.226 ns/token²,
// within 1.8% of every row. (§3's own fits, 28 ms + 19.5 µs·t + 0.29 ns·t²,
// charge the base once a request; summed over chunks they miss by 8%.)
// Capacity: ≈1.22M GPU KV tokens at --gpu-memory-utilization 0.85,
// max-model-len 65,536 (§4, same report), as 76,250 blocks of 16.
// Decode: no TP=1 row (§7 has TP=4 only); the per-KV-token cost is an
// assumption (41.5 KB/token, §4, read at ≈3.4 TB/s: 70% of the H200's
// rated HBM bandwidth, which is not a row of the page).
// KV and links: 41,500 B/token (§4); pulls over RDMA between a warmed pair
// from the P2P report's fit, 28 ms + 10.6 µs/token (kv-transfer.md §6, §5
// here): 41,500 B / 10.6 µs ≈ 3.9 GB/s. The fit is of whole requests
// (lookup, transfer, load-back, the last block's step), and the engine's
// core already charges a pulled request two steps of its own (the
// lookup's and the last block's, 2 × 29.8 ms, more than the whole 28 ms
// intercept), so the link's own setup is RDMA's per-transfer setup of
// §5, 1 ms (0.5–2 ms), not 28 ms: charging the intercept again would
// count the fixed costs twice. Even so the core's pull costs ≈ 84 ms at
// 2,048 tokens against the report's 49 ms (its step base is a chunk
// fit's intercept, heavier than a 16-token step), so on this profile a
// pull wins from ≈ 4K tokens, not at every length. The published pulls
// ran on warmed pairs, so no connection cost is known (0).
// CPU tier: 88 GiB (§4, the P2P guide's deployment, ≈2.2M tokens).
// Host-to-device: ≈50 GB/s, an inference (§6).
func gptOSS120BH200() Profile {
	return Profile{
		Name: GPTOSS120BH200,
		Sources: []string{
			"engine-profiles.md §3: gpt-oss-120b / H200 TP=1 single cold request medians, 2,048–49,152 tokens (gpt-oss-120b-h200.md@067fe1b)",
			"engine-profiles.md §4: 41.5 KB/token (P2P benchmarking/README.md@01cac34); ≈1.22M GPU KV tokens, max-model-len 65,536 (gpt-oss-120b-h200.md@067fe1b)",
			"engine-profiles.md §3 (chunking): chunk 8192 on the matrix's GPU paths; §8: gptoss120b-h200, chunk 8192",
			"engine-profiles.md §5 and kv-transfer.md §6: pull ≈ 28 ms + 10.6 µs/token on a warmed RDMA pair (gpt-oss-120b-h200.md@067fe1b fit; its slope here, its intercept in the core's steps and RDMA's 1 ms setup, §5)",
			"engine-profiles.md §4: 88 GiB CPU tier (gpt-oss-120b-h200.md@067fe1b)",
		},
		Uncalibrated: []string{
			"decode: no published TP=1 decode row (§7's 6.6–7.4 ms TPOT is TP=4); 0.1 ms per sequence is sim-default's",
			"decode per KV token: assumed from 41.5 KB/token at 70% of the H200's rated HBM bandwidth",
			"loaded prefill: fitted to single requests only; no saturating-batch row",
			"host-to-device bandwidth: ≈50 GB/s is an inference (engine-profiles.md §6), not a measurement",
			"pull connection setup: the published pulls ran on warmed pairs; the first pull's cost is unknown (0)",
		},
		StepBase:               29_800 * time.Microsecond,
		PrefillTokensPerSecond: 1 / 19.14e-6,
		PrefillQuadratic:       0.226e-9,
		DecodePerSeq:           100 * time.Microsecond,
		DecodePerKVToken:       12e-9,
		MaxNumBatchedTokens:    8192,
		BlockSize:              16,
		NumGPUBlocks:           76_250,
		MaxModelLen:            65_536,
		KVBytesPerToken:        41_500,
		H2DBytesPerSecond:      50e9,
		PullSetup:              time.Millisecond,
		PullBytesPerSecond:     41_500 / 10.6e-6,
		CPUBytes:               88 << 30,
	}
}

// qwen332BH100TP2 is Qwen3-32B on two H100s (TP=2), vLLM, chunk 8192: the
// peers' reference path.
//
// Prefill: T(8192) = 0.40 s, a single cold request (engine-profiles.md §2
// and §3, sticky blog: 20,480 tok/s); the blog's quadratic over k × 8192
// tokens is not published, so c = 0 and the split of 0.40 s between the
// step base and the linear term is assumed: a = 25 ms (sim-default's), b
// = 375 ms / 8,192 = 45.78 µs/token. The recipe's 15,928 tok/s (§2,
// configuration matrix) reads 22% slower (T(8192) = 0.514 s).
// Capacity: 307,328 KV tokens per pod (§4), as 19,208 blocks of 16.
// Decode: ≈50 ms per token per stream at 35 streams per endpoint (§7,
// the sticky blog's knee, itself an inference) gives (50 − 25) / 35 ≈
// 0.714 ms per sequence, the knee's KV tokens being unpublished; the
// per-KV-token cost is an assumption (256 KiB/token, §4, half per GPU,
// read at ≈2.3 TB/s: 70% of the H100's rated HBM bandwidth).
// KV and links: 256 KiB/token (§4); no published pull row, so the link is
// assumed InfiniBand NDR at ≈40 GB/s with 1 ms of RDMA setup (§5, §8) and
// no connection cost; host-to-device ≈50 GB/s (§6, an inference); no
// published CPU tier.
func qwen332BH100TP2() Profile {
	return Profile{
		Name: Qwen332BH100TP2,
		Sources: []string{
			"engine-profiles.md §2: Qwen3-32B / H100 TP=2 chunk 8192, 20,480 tok/s, T(8192) = 0.40 s (sticky blog); 15,928 tok/s (configuration-matrix.md@127478c)",
			"engine-profiles.md §3: the blog's quadratic fit over k × 8192 tokens, coefficients not published",
			"engine-profiles.md §4: 256 KiB/token; 307,328 KV tokens per pod (blog/2025-09-24_kvcache-wins-you-can-see.md)",
			"engine-profiles.md §7: ≈7.0K output tok/s at concurrency 350 over 10 endpoints (sticky blog); §8: qwen3-32b-h100-tp2",
			"engine-profiles.md §5 and §8: assumed InfiniBand NDR ≈40 GB/s, RDMA setup 1 ms (no published pull row)",
		},
		Uncalibrated: []string{
			"prefill quadratic term: not published (c = 0)",
			"step base: not published; 25 ms assumed (sim-default's), the linear term takes the rest of T(8192)",
			"decode per sequence: from the decode knee (an inference), its KV tokens unknown",
			"decode per KV token: assumed from 256 KiB/token at 70% of the H100's rated HBM bandwidth",
			"max_model_len: not published; 163,840 holds the blog's 19 × 8192-token requests",
			"pulls: no published row; InfiniBand NDR ≈40 GB/s, 1 ms of setup and no connection cost assumed",
			"host-to-device bandwidth: ≈50 GB/s assumed (engine-profiles.md §6 is an inference)",
			"CPU tier: none published (0)",
		},
		StepBase:               25 * time.Millisecond,
		PrefillTokensPerSecond: 8192 / 0.375,
		DecodePerSeq:           714 * time.Microsecond,
		DecodePerKVToken:       56e-9,
		MaxNumBatchedTokens:    8192,
		BlockSize:              16,
		NumGPUBlocks:           19_208,
		MaxModelLen:            163_840,
		KVBytesPerToken:        262_144,
		H2DBytesPerSecond:      50e9,
		PullSetup:              time.Millisecond,
		PullBytesPerSecond:     40e9,
	}
}

// glm52Rank is one data-parallel rank of GLM-5.2-FP8 on H200 (vLLM DP8,
// TP=1), chunk 4096.
//
// Prefill: through the two single-request rows of engine-profiles.md §3
// (glm-5.2-h200.md@01cac34): 1.00 s at 8,070 tokens, 13.75 s at 98,220,
// with the chunk budget of RESULTS.md@03dfc8c (4,096; its long-prefill
// threshold of 2,048 is not modelled) and an assumed step base of 25 ms:
// b = 116.3 µs/token, c = 0.179 ns/token² (124 µs/token at 8K, 140 at
// 98K). The loaded rate, 3,585 tok/s per rank under a saturating batch
// (§2, RESULTS.md@03dfc8c, another deployment), is ≈2× slower and not
// reproduced: --sim-prefill-tokens-per-s 3585 approximates it.
// Capacity: ≈520K GPU KV tokens per rank (§4, GLM report), as 32,500
// blocks of 16. Decode: no row; the per-KV-token cost is an assumption
// (≈93 KB/token, §4, at ≈3.4 TB/s: 70% of the H200's rated bandwidth).
// KV and links: 93,000 B/token (§4); a pull costs a floor of 1.25 s
// (calibrate_work_boundary.py's default, the blog's 1.2–1.3 s; §5) plus
// the bytes at ≈4.5 GB/s (the GLM report's "floor plus ≈4.5 GB/s"), and
// the first pull between a pair ≈6 s more (§5, GLM report). CPU tier:
// 100 GiB per rank (§4). Host-to-device: ≈50 GB/s, an inference (§6).
// This is the profile where pulls lose to short prefixes: against its own
// single-request prefill (ColdPrefill) a lone warmed pull costs more below
// ≈12K tokens (from 12,017 tokens on the pull is faster;
// TestPullCrossovers computes it). The ≈8.6K of
// kv-transfer.md §6 is calibrate_work_boundary.py's crossover against the
// loaded rate, 3,585 tok/s per rank, with its 134 µs/token transfer slope;
// against that loaded rate this profile's 4.5 GB/s pulls win from 4,840.
// (gptoss120b-h200's pulls win at every length, as §8 says.)
func glm52Rank() Profile {
	return Profile{
		Name: GLM52Rank,
		Sources: []string{
			"engine-profiles.md §3: GLM-5.2-FP8 single request on one rank, 1.00 s at 8,070 tokens, 13.75 s at 98,220 (glm-5.2-h200.md@01cac34)",
			"engine-profiles.md §2: 3,585 tok/s per DP rank under a saturating batch (RESULTS.md@03dfc8c); §3: chunk budget 4096 there",
			"engine-profiles.md §4: ≈93 KB/token; ≈520K GPU KV tokens per rank (glm-5.2-h200.md@01cac34); §8: glm52-rank",
			"engine-profiles.md §5 and kv-transfer.md §6: pull floor 1.25 s (calibrate_work_boundary.py@79cf1a1), ≈4.5 GB/s (glm-5.2-h200.md@01cac34), ≈6 s first pull between a pair",
			"engine-profiles.md §4: 100 GiB CPU tier per rank (GLM report)",
		},
		Uncalibrated: []string{
			"step base: not published; 25 ms assumed (sim-default's)",
			"loaded prefill: the 3,585 tok/s saturating-batch rate is not reproduced (single-request fit)",
			"chunk: the single-request rows do not state theirs; 4,096 is RESULTS.md's budget",
			"decode: no published row; 0.1 ms per sequence is sim-default's",
			"decode per KV token: assumed from 93 KB/token at 70% of the H200's rated HBM bandwidth",
			"max_model_len: not published; 131,072 holds the 98,220-token requests",
			"host-to-device bandwidth: ≈50 GB/s is an inference (engine-profiles.md §6), not a measurement",
			"pull bandwidth: one rep; the report's pulls are almost flat to 98K tokens, ≈4.5 GB/s read from them",
		},
		StepBase:               25 * time.Millisecond,
		PrefillTokensPerSecond: 1 / 116.3e-6,
		PrefillQuadratic:       0.179e-9,
		DecodePerSeq:           100 * time.Microsecond,
		DecodePerKVToken:       28e-9,
		MaxNumBatchedTokens:    4096,
		BlockSize:              16,
		NumGPUBlocks:           32_500,
		MaxModelLen:            131_072,
		KVBytesPerToken:        93_000,
		H2DBytesPerSecond:      50e9,
		PullSetup:              1250 * time.Millisecond,
		PullBytesPerSecond:     4.5e9,
		PullConnect:            6 * time.Second,
		CPUBytes:               100 << 30,
	}
}
