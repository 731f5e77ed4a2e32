package fleetview_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/metrictest"
)

// BenchmarkFleetLagAndBandwidth runs 8 engines with sidecars and one picker
// in this process at the per-endpoint rate: each engine stores
// 1,000 blocks/s (a 1,024-token prompt every 64 ms) into a full cache, so
// every store also evicts. Two prompt sizes: 64 blocks a request (one
// delta carries a request's stores and evictions) and 16. It reports the picker's event-to-routable lag
// (histogram bucket bounds) and the bytes sent per block stored or removed
// over the measured window only (after a warm-up that fills the caches):
// the summary payload, and the whole stream message with gRPC's prefix.
// (64 engine+sidecar pairs do not fit two cores; the lag at 64 endpoints is
// BenchmarkFleetLag64.)
func BenchmarkFleetLagAndBandwidth(b *testing.B) {
	for _, promptTokens := range []int{1024, 256} {
		b.Run(fmt.Sprintf("prompt=%d", promptTokens), func(b *testing.B) { benchLag(b, promptTokens) })
	}
}

func benchLag(b *testing.B, promptTokens int) {
	const pods, gpuBlocks = 8, 4096
	var ps []*pod
	for i := 0; i < pods; i++ {
		join := ""
		if i > 0 {
			join = ps[0].members.LocalAddr()
		}
		ps = append(ps, startPodWith(b, i, join, podOptions{gpuBlocks: gpuBlocks, capacity: gpuBlocks, gossip: true}))
	}
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(viewConfig(summary.ForCapacity(gpuBlocks), 100*time.Millisecond), zap.NewNop(), reg)
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	for _, p := range ps {
		v.Watch(p.sidecar.GRPCAddr())
	}
	// Warm-up: twice each cache's size, unpaced.
	base := uint32(1000)
	for i := 0; i < 2*pods*gpuBlocks/(promptTokens/16); i++ {
		complete(b, ps[i%pods].engine, tokens(promptTokens, base))
		base += 100
	}
	time.Sleep(300 * time.Millisecond)
	before := fleetCounters(b, ps, reg)
	b.ResetTimer()
	start := time.Now()
	interval := time.Duration(promptTokens/16) * time.Second / (1000 * pods) // 1,000 blocks/s per engine
	for i := 0; i < b.N; i++ {
		complete(b, ps[i%pods].engine, tokens(promptTokens, base))
		base += 100
		if d := time.Until(start.Add(time.Duration(i+1) * interval)); d > 0 {
			time.Sleep(d)
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	time.Sleep(300 * time.Millisecond)
	after := fleetCounters(b, ps, reg)
	blocks := after.blocks - before.blocks
	b.ReportMetric(blocks/2/elapsed.Seconds()/pods, "stored-blocks/s/engine")
	b.ReportMetric((after.payload-before.payload)/blocks, "payload-B/block")
	b.ReportMetric((after.wire-before.wire)/blocks, "stream-B/block")
	b.ReportMetric(quantile(before.lag, after.lag, 0.5)*1000, "lag-p50-ms≤")
	b.ReportMetric(quantile(before.lag, after.lag, 0.99)*1000, "lag-p99-ms≤")
}

// BenchmarkFleetLag64 is the scale: 64 engines with a sidecar each
// (no gossip: the picker is given the addresses; engine scrapes every
// second, not 200 ms, as 64 pods' scrapes would have 64 pods' CPUs) and
// one picker, every
// engine storing 1,000 blocks/s into a full cache (a 2,048-token prompt
// every 128 ms), driven by 32 workers of 2 engines each. b.N is the number
// of requests. It reports the picker's event-to-routable lag over the
// measured window and the rate reached.
func BenchmarkFleetLag64(b *testing.B) {
	const pods, workers, gpuBlocks, promptTokens = 64, 32, 2048, 2048
	ps := make([]*pod, pods)
	for i := range ps {
		ps[i] = startPodWith(b, i, "", podOptions{gpuBlocks: gpuBlocks, capacity: gpuBlocks, scrape: time.Second})
	}
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(viewConfig(summary.ForCapacity(gpuBlocks), 100*time.Millisecond), zap.NewNop(), reg)
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	for _, p := range ps {
		v.Watch(p.sidecar.GRPCAddr())
	}
	// run sends n requests from each worker, round-robin over its engines,
	// paced at 1,000 blocks/s per engine when pace is set.
	run := func(n int, base uint32, pace bool) {
		interval := time.Duration(promptTokens/16) * time.Second / (1000 * pods / workers)
		done := make(chan struct{})
		for w := 0; w < workers; w++ {
			go func() {
				defer func() { done <- struct{}{} }()
				start := time.Now()
				for i := 0; i < n; i++ {
					e := ps[w*pods/workers+i%(pods/workers)].engine
					complete(b, e, tokens(promptTokens, base+uint32((w*n+i)*100)))
					if d := time.Until(start.Add(time.Duration(i+1) * interval)); pace && d > 0 {
						time.Sleep(d)
					}
				}
			}()
		}
		for range workers {
			<-done
		}
	}
	run(2*gpuBlocks/(promptTokens/16)*pods/workers, 1000, false) // fill every cache twice
	time.Sleep(500 * time.Millisecond)
	before := fleetCounters(b, ps, reg)
	b.ResetTimer()
	start := time.Now()
	run(max(1, b.N/workers), 1<<22, true)
	elapsed := time.Since(start)
	b.StopTimer()
	time.Sleep(500 * time.Millisecond)
	after := fleetCounters(b, ps, reg)
	if n := len(v.Endpoints()); n != pods {
		b.Fatalf("the picker holds %d endpoints", n)
	}
	b.ReportMetric((after.blocks-before.blocks)/2/elapsed.Seconds()/pods, "stored-blocks/s/engine")
	b.ReportMetric((after.wire-before.wire)/(after.blocks-before.blocks), "stream-B/block")
	b.ReportMetric(quantile(before.lag, after.lag, 0.5)*1000, "lag-p50-ms≤")
	b.ReportMetric(quantile(before.lag, after.lag, 0.99)*1000, "lag-p99-ms≤")
}

type counters struct {
	blocks, payload, wire float64
	lag                   metrictest.Histogram
}

// fleetCounters reads the blocks stored and removed on every engine, the
// sidecars' delta payload and stream bytes, and the picker's lag histogram.
func fleetCounters(b *testing.B, ps []*pod, picker *prometheus.Registry) counters {
	var c counters
	for _, p := range ps {
		for _, st := range p.sidecar.State() {
			c.blocks += float64(st.Index.StoredBlocks + st.Index.RemovedBlocks)
		}
		families, err := p.sidecar.Registry().Gather()
		if err != nil {
			b.Fatal(err)
		}
		c.payload += metrictest.Sum(families, "kvroute_sidecar_summary_delta_bytes_total", nil)
		c.wire += metrictest.Sum(families, "kvroute_sidecar_stream_bytes_total", map[string]string{"kind": "delta"})
	}
	c.lag = pickerLag(b, picker)
	return c
}

// pickerLag reads the picker's event-to-routable histogram.
func pickerLag(b *testing.B, picker *prometheus.Registry) metrictest.Histogram {
	families, err := picker.Gather()
	if err != nil {
		b.Fatal(err)
	}
	if metrictest.Series(families, "kvroute_picker_event_to_routable_seconds", nil) == 0 {
		b.Fatal("no lag histogram")
	}
	return metrictest.HistogramOf(families, "kvroute_picker_event_to_routable_seconds", nil)
}

// quantile returns the upper bound of the bucket holding quantile q of the
// observations made between two reads of a histogram (-1: above the last
// bound).
func quantile(before, after metrictest.Histogram, q float64) float64 {
	if v := after.Sub(before).Quantile(q); !math.IsInf(v, 1) {
		return v
	}
	return -1
}
