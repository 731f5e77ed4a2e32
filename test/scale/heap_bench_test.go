package scale

import (
	"context"
	"flag"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/picker"
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
			deadline := time.Now().Add(syncWithin)
			for snapshots(b, reg) < float64(s.admitted()) || loadsWaiting(b, reg) > 0 {
				if time.Now().After(deadline) {
					b.Fatal("not synced")
				}
				time.Sleep(10 * time.Millisecond)
			}
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

func snapshots(b *testing.B, reg *prometheus.Registry) float64 {
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "kvroute_picker_summary_updates_total" {
			for _, m := range f.Metric {
				for _, l := range m.Label {
					if l.GetName() == "kind" && l.GetValue() == "snapshot" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return 0
}

func loadsWaiting(b *testing.B, reg *prometheus.Registry) float64 {
	families, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "kvroute_picker_snapshot_loads_waiting" {
			return f.Metric[0].GetGauge().GetValue()
		}
	}
	return 0
}
