package fleetview_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
)

// BenchmarkFleetLagAndBandwidth runs 8 engines with sidecars and one
// picker in this process, stores and evicts blocks on every engine, and
// reports the picker's event-to-routable lag (histogram bucket bounds) and
// the summary bytes sent per block stored or removed. (The scale is
// 64 endpoints × 1,000 blocks/s; 8 real engine+sidecar pairs are what two
// cores carry beside the picker.)
func BenchmarkFleetLagAndBandwidth(b *testing.B) {
	const pods = 8
	var ps []*pod
	for i := 0; i < pods; i++ {
		join := ""
		if i > 0 {
			join = ps[0].members.LocalAddr()
		}
		ps = append(ps, startPod(b, i, join))
	}
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(fleetview.Config{Params: summary.ForCapacity(capacity), Retry: 100 * time.Millisecond}, zap.NewNop(), reg)
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	for _, p := range ps {
		v.Watch(p.sidecar.GRPCAddr())
	}
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		complete(b, ps[i%pods].engine, tokens(64, uint32(1000+i*100)))
		if d := time.Until(start.Add(time.Duration(i+1) * 2 * time.Millisecond)); d > 0 {
			time.Sleep(d) // paced: 500 requests/s, 2,000 blocks/s across the fleet
		}
	}
	b.StopTimer()
	time.Sleep(300 * time.Millisecond)
	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() != "kvroute_picker_event_to_routable_seconds" {
			continue
		}
		h := f.Metric[0].GetHistogram()
		q := func(p float64) float64 {
			for _, bk := range h.Bucket {
				if float64(bk.GetCumulativeCount()) >= p*float64(h.GetSampleCount()) {
					return bk.GetUpperBound() * 1000
				}
			}
			return -1
		}
		b.ReportMetric(q(0.5), "lag-p50-ms≤")
		b.ReportMetric(q(0.99), "lag-p99-ms≤")
	}
	var bytes, blocks float64
	for _, p := range ps {
		for _, st := range p.sidecar.State() {
			blocks += float64(st.Index.StoredBlocks + st.Index.RemovedBlocks)
		}
		bytes += sidecarDeltaBytes(b, p)
	}
	if blocks > 0 {
		b.ReportMetric(bytes/blocks, "delta-bytes/block")
	}
}

// sidecarDeltaBytes reads a sidecar's kvroute_sidecar_summary_delta_bytes_total.
func sidecarDeltaBytes(b *testing.B, p *pod) float64 {
	families, err := p.sidecar.Registry().Gather()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() == "kvroute_sidecar_summary_delta_bytes_total" {
			for _, m := range f.Metric {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}
