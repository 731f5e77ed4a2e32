package fleetview_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
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
		testnet.Await(b, 30*time.Second, time.Millisecond, func() error {
			if n := metrictest.Gathered(b, reg, "kvroute_picker_summary_updates_total", map[string]string{"kind": "snapshot"}); n < endpoints {
				return fmt.Errorf("not synced: %v snapshots applied of %d", n, endpoints)
			}
			return nil
		})
		b.StopTimer()
		v.Close()
		b.StartTimer()
	}
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
	testnet.Await(b, time.Minute, 50*time.Millisecond, func() error {
		if n, lags := len(v.Endpoints()), pickerLag(b, reg).Count; n < endpoints || lags < endpoints {
			return fmt.Errorf("%d endpoints, %d lags observed", n, lags)
		}
		return nil
	})
	time.Sleep(time.Second) // past the snapshots' load
	before := pickerLag(b, reg)
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * 10 * time.Millisecond)
	b.StopTimer()
	after := pickerLag(b, reg)
	b.ReportMetric(float64(after.Count-before.Count)/float64(b.N)/endpoints, "deltas/tick/endpoint")
	b.ReportMetric(quantile(before, after, 0.5)*1000, "lag-p50-ms≤")
	b.ReportMetric(quantile(before, after, 0.99)*1000, "lag-p99-ms≤")
}
