package workload

import (
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// vocab is the scenarios' word list.
var vocab = []string{"cache", "block", "router", "engine", "prefix", "token", "agent", "tool", "policy", "order",
	"status", "latency", "replica", "summary", "request", "stream", "tenant", "salt", "event", "shard"}

// Words returns n pseudo-random words from rng.
func Words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(word(rng))
	}
	return b.String()
}

func word(rng *rand.Rand) string {
	w := vocab[rng.IntN(len(vocab))]
	if rng.IntN(12) == 0 {
		w += strconv.Itoa(rng.IntN(1000))
	}
	return w
}

// Text returns pseudo-random words from rng making n tokens (± one word)
// for the simulated engine's tokenizer, which splits every word on its own.
func Text(rng *rand.Rand, n int) string {
	var b strings.Builder
	for got := 0; got < n; {
		w := word(rng)
		if b.Len() > 0 {
			w = " " + w
		}
		got += len(chat.Encode(w))
		b.WriteString(w)
	}
	return b.String()
}
