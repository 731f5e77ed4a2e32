package sidecar_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/sidecar"
	"github.com/kvroute/kvroute/test/enginesim"
)

// BenchmarkEventToSummaryLag runs an engine and a sidecar on loopback and
// reports the lag from the engine stamping a batch to its blocks being in
// the summary (bucket upper bounds of the sidecar's histogram).
// Target: p99 ≤ 5 ms. "saturated" sends requests back to back, so engine,
// sidecar and client compete for the two cores; "paced" leaves 2 ms
// between requests, as an engine that is not CPU-starved publishes.
func BenchmarkEventToSummaryLag(b *testing.B) {
	for _, pace := range []time.Duration{0, 2 * time.Millisecond} {
		name := "saturated"
		if pace > 0 {
			name = "paced"
		}
		b.Run(name, func(b *testing.B) { lagBench(b, pace) })
	}
}

func lagBench(b *testing.B, pace time.Duration) {
	ecfg := engineConfig()
	p, err := enginesim.Start(ecfg, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	e := p.Engines()[0]
	reg := prometheus.NewRegistry()
	cfg := sidecarConfig(e)
	s, err := sidecar.Start(context.Background(), cfg, zap.NewNop(), reg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	t := &testing.T{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		complete(t, e, prompt(64, 1000*(i%100000+1)), "")
		if pace > 0 {
			time.Sleep(pace)
		}
	}
	b.StopTimer()
	converged(t, s, e, 0)
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "kvroute_sidecar_event_to_summary_lag_seconds" {
			continue
		}
		h := f.Metric[0].GetHistogram()
		total := float64(h.GetSampleCount())
		quantile := func(q float64) float64 {
			for _, bk := range h.Bucket {
				if float64(bk.GetCumulativeCount()) >= q*total {
					return bk.GetUpperBound()
				}
			}
			return -1
		}
		b.ReportMetric(quantile(0.5)*1000, "p50-ms≤")
		b.ReportMetric(quantile(0.99)*1000, "p99-ms≤")
		b.ReportMetric(h.GetSampleSum()/total*1000, "mean-ms")
	}
}
