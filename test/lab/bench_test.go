package lab

import (
	"os"
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

// BenchmarkTrace: one policy, one seed of the synthetic Mooncake trace
// (3,993 requests at seed 0, 8 engines) — the 30 s target.
func BenchmarkTrace(b *testing.B) {
	path := "../../../shared/traces/mooncake_synthetic_trace.jsonl"
	if _, err := os.Stat(path); err != nil {
		b.Skip("the synthetic trace is not beside the repository: ", err)
	}
	for i := 0; i < b.N; i++ {
		if _, err := Run(DefaultConfig(), workload.Trace{Path: path}, workload.Options{Seed: 0, Rate: 1}); err != nil {
			b.Fatal(err)
		}
	}
}
