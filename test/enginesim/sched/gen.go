package sched

import (
	"hash/fnv"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// words feed the deterministic output text.
var words = []string{
	"the", "cache", "block", "prefix", "token", "router", "engine", "request",
	"model", "answer", "tool", "call", "result", "data", "value", "state",
	"first", "next", "last", "long", "short", "fast", "slow", "warm",
	"cold", "shared", "local", "remote", "queue", "batch", "step", "turn",
}

// generator yields a deterministic token stream seeded by the prompt.
type generator struct {
	x       uint64
	pending []uint32
	n       int
}

func newGenerator(prompt []uint32, salt string) generator {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range prompt {
		b[0], b[1], b[2], b[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		h.Write(b[:])
	}
	h.Write([]byte(salt))
	return generator{x: h.Sum64() | 1}
}

// naturalLength is the reply's length when it ends on its own: 16–63 tokens.
func (g *generator) naturalLength() int { return 16 + int(g.x%48) }

func (g *generator) next() uint32 {
	for len(g.pending) == 0 {
		g.x ^= g.x << 13
		g.x ^= g.x >> 7
		g.x ^= g.x << 17
		w := words[g.x%uint64(len(words))]
		if g.n > 0 {
			w = " " + w
			if g.n%9 == 0 {
				w = "." + w
			}
		}
		g.n++
		g.pending = chat.Encode(w)
	}
	t := g.pending[0]
	g.pending = g.pending[1:]
	return t
}

// NaturalLength is the number of tokens a reply to prompt (with cache
// salt salt) has when it ends on its own: 16 to 63.
func NaturalLength(prompt []uint32, salt string) int {
	g := newGenerator(prompt, salt)
	return g.naturalLength()
}
