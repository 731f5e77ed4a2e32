package lab

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/workload"
)

// BenchmarkScale1000 is the lab at fleet scale: 1,000 engines, 4
// pickers, 100,000 requests of uniform-pool scaled to the fleet (8
// prefixes per engine, 12 requests a second per 8 engines), summaries
// sized to the engines' 4,800 blocks. It reports
// the run's peak resident memory (VmHWM). The targets: at most
// 15 minutes and 4 GiB.
//
//	go test -run '^$' -bench Scale1000 -benchtime 1x -timeout 30m ./test/lab
func BenchmarkScale1000(b *testing.B) {
	sc := workload.UniformPool{Engines: 1000, Prefixes: 8000, Requests: 100_000, QPS: 1500}
	cfg := DefaultConfig()
	cfg.Pickers, cfg.Capacity = 4, 4800 // summaries sized to the engines' KV, as an operator sets --capacity
	for i := 0; i < b.N; i++ {
		start := time.Now()
		outs, err := Run(cfg, sc, workload.Options{Seed: 1, Rate: 1})
		if err != nil {
			b.Fatal(err)
		}
		f := figuresOf(outs, engineURLs(cfg, sc))
		b.Logf("%d requests, %d completed, hit %.3f, TTFT mean %.0f ms p90 %.0f ms, %.0f s simulated, %.0f s wall, peak RSS %s",
			f.Requests, f.Completed, float64(f.HitRate), float64(f.TTFTMean), float64(f.TTFTP90), float64(f.DurationS), time.Since(start).Seconds(), peakRSS())
	}
}

// peakRSS is this process's peak resident set (VmHWM), as the kernel
// reports it.
func peakRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
