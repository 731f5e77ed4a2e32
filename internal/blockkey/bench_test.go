package blockkey

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkCanonical32k keys a 32k-token prompt (2,048 blocks of 16), as the
// picker does per request. Target: ≤ 100 µs on one core.
func BenchmarkCanonical32k(b *testing.B) {
	tokens := randTokens(rand.New(rand.NewPCG(1, 1)), 32768)
	dst := make([]Key, 0, 2048)
	for _, salt := range []string{"", "tenant-a"} {
		name := "plain"
		if salt != "" {
			name = "salted"
		}
		b.Run(name, func(b *testing.B) {
			r := Request{Tokens: tokens, CacheSalt: salt}
			b.SetBytes(int64(4 * len(tokens)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				dst = r.AppendKeys(dst[:0], "Qwen/Qwen3-32B", 16)
			}
			if len(dst) != 2048 {
				b.Fatalf("%d keys", len(dst))
			}
		})
	}
}

// BenchmarkVLLMChain32k is vLLM's sha256_cbor over the same prompt (the
// simulated engine's cost per uncached prompt).
func BenchmarkVLLMChain32k(b *testing.B) {
	tokens := randTokens(rand.New(rand.NewPCG(1, 1)), 32768)
	h := NewSHA256CBOR(DefaultSeed)
	dst := make([]Digest, 0, 2048)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		if dst, err = h.AppendChain(dst[:0], nil, 16, tokens, nil); err != nil {
			b.Fatal(err)
		}
	}
}
