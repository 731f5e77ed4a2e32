package fleetview_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/simsidecar"
)

// BenchmarkFleetSyncSimulated: a picker started against 64 simulated
// sidecars, each with a full 65,536-block summary and 1,000 blocks/s of
// churn, until every endpoint's snapshot is applied — the restarted-picker
// sync, over gRPC on loopback. One op is one picker's full sync.
func BenchmarkFleetSyncSimulated(b *testing.B) {
	const endpoints, capacity, rate = 64, 65536, 1000
	params := summary.ForCapacity(capacity)
	var sims []*simsidecar.Sidecar
	for i := range endpoints {
		sims = append(sims, simsidecar.Start(b, simsidecar.Config{Index: i, Params: params, Rate: rate}))
	}
	b.ResetTimer()
	for range b.N {
		reg := prometheus.NewRegistry()
		v, err := fleetview.New(viewConfig(params, 100*time.Millisecond), zap.NewNop(), reg)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range sims {
			v.Watch(s.Addr())
		}
		deadline := time.Now().Add(30 * time.Second)
		for appliedSnapshots(b, reg) < endpoints {
			if time.Now().After(deadline) {
				b.Fatal("not synced after 30 s")
			}
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		v.Close()
		b.StartTimer()
	}
}

func appliedSnapshots(b *testing.B, reg *prometheus.Registry) float64 {
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "kvroute_picker_summary_updates_total" {
			for _, m := range f.Metric {
				if label(m, "kind") == "snapshot" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// BenchmarkFleetLagSimulated: one picker following 64 simulated sidecars
// (test/simsidecar),
// each endpoint storing (and evicting) 1,000 blocks a second into a full
// 65,536-block summary with deltas every 10 ms — the scale for the
// event-to-routable lag, picker side. The run lasts b.N deltas per sidecar
// (-benchtime 500x = 5 s).
func BenchmarkFleetLagSimulated(b *testing.B) {
	const endpoints, capacity, rate = 64, 65536, 1000
	params := summary.ForCapacity(capacity)
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(viewConfig(params, 100*time.Millisecond), zap.NewNop(), reg)
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	for i := range endpoints {
		v.Watch(simsidecar.Start(b, simsidecar.Config{Index: i, Params: params, Rate: rate}).Addr())
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(v.Endpoints()) < endpoints || pickerLag(b, reg).GetSampleCount() < endpoints {
		if time.Now().After(deadline) {
			b.Fatalf("%d endpoints after a minute", len(v.Endpoints()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // past the snapshots' load
	before := pickerLag(b, reg)
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * 10 * time.Millisecond)
	b.StopTimer()
	after := pickerLag(b, reg)
	b.ReportMetric(float64(after.GetSampleCount()-before.GetSampleCount())/float64(b.N)/endpoints, "deltas/tick/endpoint")
	b.ReportMetric(quantile(before, after, 0.5)*1000, "lag-p50-ms≤")
	b.ReportMetric(quantile(before, after, 0.99)*1000, "lag-p99-ms≤")
}
