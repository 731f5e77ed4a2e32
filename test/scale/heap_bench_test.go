package scale

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

var heapProfile = flag.String("scale.heapprofile", "", "BenchmarkPickerHeap: write the heap profile, once the in-process picker is synced, to this file")

// BenchmarkPickerHeap: where a synced picker's memory goes. The picker
// server (picker.Start, as `kvroute picker` runs it) in the benchmark
// process, following the shapes' simulated sidecars (light churn); once
// every admitted endpoint's snapshot is written into the index and after
// a GC, the heap
// in use beyond what it was before the picker started (the sidecars' own
// heap excluded), and with -scale.heapprofile the heap profile to read
// with `go tool pprof -sample_index=inuse_space`.
func BenchmarkPickerHeap(b *testing.B) {
	for _, s := range []shape{{1000, 1}} {
		b.Run(s.String(), func(b *testing.B) {
			f := startSims(b, s.endpoints, s.models, lightChurn)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			cfg := picker.DefaultServerConfig()
			cfg.AdminListen = "127.0.0.1:0"
			cfg.Listen, cfg.GRPCListen, cfg.Gossip, cfg.Sidecars, cfg.Capacity, cfg.DrainDelay = "127.0.0.1:0", "", nil, f.addrs, capacity, 0
			reg := prometheus.NewRegistry()
			srv, err := picker.Start(context.Background(), cfg, nil, reg)
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			testnet.Await(b, syncWithin, 10*time.Millisecond, func() error {
				snapshots := metrictest.Gathered(b, reg, "kvroute_picker_summary_updates_total", map[string]string{"kind": "snapshot"})
				waiting := metrictest.Gathered(b, reg, "kvroute_picker_snapshot_loads_waiting", nil)
				if snapshots < float64(s.admitted()) || waiting > 0 {
					return fmt.Errorf("not synced: %v snapshots of %d, %v loads waiting", snapshots, s.admitted(), waiting)
				}
				return nil
			})
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/(1<<20), "picker-heap-inuse-MiB")
			b.ReportMetric(float64(after.StackInuse-before.StackInuse)/(1<<20), "picker-stacks-MiB")
			b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
			if *heapProfile != "" {
				out, err := os.Create(*heapProfile)
				if err != nil {
					b.Fatal(err)
				}
				defer out.Close()
				if err := pprof.Lookup("heap").WriteTo(out, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
