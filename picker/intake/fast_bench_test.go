package intake

import (
	"encoding/json"
	"testing"
)

// BenchmarkTokenBody: reading an 8k-token token-id body.
func BenchmarkTokenBody(b *testing.B) {
	ids := make([]uint32, 8192)
	for i := range ids {
		ids[i] = uint32(i * 7919 % 151000)
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "token_ids": ids, "cache_salt": "s"})
	var p Parser
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.Parse(Tokens, body); err != nil {
			b.Fatal(err)
		}
	}
}
