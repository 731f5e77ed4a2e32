package lab

import (
	"testing"

	"github.com/kvroute/kvroute/test/workload"
)

// BenchmarkRunConvos: one run of 64 four-turn conversations on 8 engines.
func BenchmarkRunConvos(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := Run(DefaultConfig(), convos{n: 64, turns: 4, engines: 8}, workload.Options{Seed: 1, Rate: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAgenticPressure: one policy, one seed of agentic-pressure
// (8 engines, 713 requests) — the 5 s target.
func BenchmarkAgenticPressure(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := Run(DefaultConfig(), workload.AgenticPressure{}, workload.Options{Seed: 1, Rate: 1}); err != nil {
			b.Fatal(err)
		}
	}
}
