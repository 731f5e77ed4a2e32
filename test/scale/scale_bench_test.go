package scale

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// shape is a fleet: endpoints spread evenly over models.
type shape struct{ endpoints, models int }

func (s shape) String() string { return fmt.Sprintf("endpoints=%d/models=%d", s.endpoints, s.models) }

// maxGroup is the most endpoints a picker admits in one identity group
// by default (--max-group-endpoints, picker/fleet.DefaultSlots): past it
// an endpoint is refused, group_full.
const maxGroup = fleet.DefaultSlots

// admitted is how many of the shape's endpoints a picker follows: at most
// maxGroup a model.
func (s shape) admitted() int {
	per := (s.endpoints + s.models - 1) / s.models
	return s.models * min(per, maxGroup)
}

// syncWithin bounds every wait for a full sync.
const syncWithin = 2 * time.Minute

// BenchmarkPickerSync: the real picker binary following simulated
// sidecars (full 65,536-block summaries, light churn: 10 blocks/s per
// endpoint, a delta every 100 ms) through --sidecars: its time from start
// to every endpoint's snapshot applied, cold and after kill -9 and a
// restart (one op: one restart to full sync; the median reported), and
// its memory once synced. Four times: every snapshot received
// (sync), every snapshot written into the index (loaded: no load waiting),
// every endpoint credited its own prefix by one explained decision of
// each model's staircase (credited: routable, its cache known, as the
// decision reads it), and every endpoint routed its own canary, a
// decision each (routable: this adds the check's own cost, a thousand
// decisions). Shapes: 64, 256, 1,000 endpoints in one model; 1,000
// endpoints in 10 and 50 models. Targets at 1,000 × 64k in one model:
// RSS ≤ 512 MiB, restart to full sync ≤ 3 s.
func BenchmarkPickerSync(b *testing.B) {
	for _, s := range []shape{{64, 1}, {256, 1}, {1000, 1}, {1000, 10}, {1000, 50}} {
		b.Run(s.String(), func(b *testing.B) { benchSync(b, s) })
	}
}

func benchSync(b *testing.B, s shape) {
	f := startSims(b, s.endpoints, s.models, lightChurn)
	p := startPicker(b, f.addrs)
	cold := p.awaitSync(s.admitted(), syncWithin)
	coldCredited := p.awaitCredited(f, s.admitted(), syncWithin)
	coldRoutable := p.awaitRoutable(f, s.admitted(), syncWithin)
	t0 := time.Now()
	p.awaitRoutable(f, s.admitted(), time.Since(p.started)+syncWithin) // every endpoint routable already: the check's own time
	check := time.Since(t0)
	rssAtSync, _ := p.memory()
	time.Sleep(5 * time.Second) // a measurement window: the memory of a picker in its steady state
	rss, hwm := p.memory()
	fams, _ := metrictest.Fetch(p.admin + "/metrics") // none: the figures read 0
	heap := metrictest.Sum(fams, "go_memstats_heap_inuse_bytes", nil)
	heapSys := metrictest.Sum(fams, "go_memstats_heap_sys_bytes", nil)
	batchSum := metrictest.HistogramOf(fams, "kvroute_picker_snapshot_batch_loads", nil).Sum
	batches := metrictest.Sum(fams, "kvroute_picker_snapshot_batch_loads", nil) // a histogram: its count
	var syncs, loads, credits, routables, loadCPU, simCPU []time.Duration
	b.ResetTimer()
	for range b.N {
		sims0 := procCPU(b, os.Getpid())
		p.restart()
		syncs = append(syncs, p.awaitSync(s.admitted(), syncWithin))
		b.StopTimer() // the loads' and the canaries' checks are not the sync
		loads = append(loads, p.awaitLoaded(s.admitted(), syncWithin))
		loadCPU, simCPU = append(loadCPU, p.cpu()), append(simCPU, procCPU(b, os.Getpid())-sims0)
		credits = append(credits, p.awaitCredited(f, s.admitted(), syncWithin))
		routables = append(routables, p.awaitRoutable(f, s.admitted(), syncWithin))
		// No snapshot since the sync (none reloaded, none waiting): the
		// canaries were answered from the summaries loaded by then.
		if n, waiting, err := p.syncState(); err != nil || n != float64(s.admitted()) || waiting != 0 {
			b.Fatalf("after the canaries: %v snapshots received (want %d: one an endpoint), %v waiting (%v)", n, s.admitted(), waiting, err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(ms(median(loads)), "restart-loaded-p50-ms")
	b.ReportMetric(ms(median(loadCPU)), "restart-loaded-picker-cpu-ms")
	b.ReportMetric(ms(median(simCPU)), "restart-loaded-bench-cpu-ms")
	b.ReportMetric(ms(check), "routable-check-ms")
	b.ReportMetric(ms(coldCredited), "cold-credited-ms")
	b.ReportMetric(ms(median(credits)), "restart-credited-p50-ms")
	b.ReportMetric(ms(coldRoutable), "cold-routable-ms")
	b.ReportMetric(ms(median(routables)), "restart-routable-p50-ms")
	b.ReportMetric(float64(s.admitted()), "endpoints-followed")
	b.ReportMetric(ms(cold), "cold-sync-ms")
	b.ReportMetric(ms(median(syncs)), "restart-sync-p50-ms")
	b.ReportMetric(ms(syncs[len(syncs)-1]), "restart-sync-max-ms")
	b.ReportMetric(rssAtSync, "rss-at-sync-MiB")
	b.ReportMetric(rss, "rss-MiB")
	b.ReportMetric(hwm, "hwm-MiB")
	b.ReportMetric(heap/(1<<20), "heap-inuse-MiB")
	b.ReportMetric(heapSys/(1<<20), "heap-sys-MiB")
	b.ReportMetric(batches, "cold-load-batches")
	b.ReportMetric(batchSum/max(batches, 1), "cold-loads-per-batch")
}

// BenchmarkPickerCPU: the picker process's CPU (utime+stime) following
// 256 and 1,000 simulated sidecars in one model (full
// 65,536-block summaries, light churn as BenchmarkPickerSync; the
// decisions go to the first model), over a 10-s window idle (streams only)
// and a 10-s window of decisions (POST /routing/v1/pick, token-id bodies
// of 1,024 tokens, paced at 1,000 a second; two endpoints hold each of
// the 64 prompts' prefixes at random depths). One op is one pair of
// windows; medians reported, in cores (CPU-seconds per second).
func BenchmarkPickerCPU(b *testing.B) {
	for _, s := range []shape{{256, 1}, {1000, 1}} {
		b.Run(s.String(), func(b *testing.B) { benchCPU(b, s) })
	}
}

func benchCPU(b *testing.B, s shape) {
	const window, rate = 10 * time.Second, 1000
	f := startSims(b, s.endpoints, s.models, lightChurn)
	model := f.models[0]
	prompts := randomPrompts(64, 1024)
	f.holdPrompts(model, prompts, "t", s.endpoints/s.models)
	bodies := make([]string, len(prompts))
	for i, pr := range prompts {
		raw, _ := json.Marshal(map[string]any{"model": model, "token_ids": pr, "cache_salt": "t"})
		bodies[i] = string(raw)
	}
	p := startPicker(b, f.addrs)
	p.awaitRoutable(f, s.admitted(), syncWithin)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 10 * time.Second}
	paced(b, client, p.base, bodies, rate, time.Second) // warm: the model list, connections; it returns once every decision is answered
	var idle, loaded, sims []float64
	var p50s, p99s []time.Duration
	b.ResetTimer()
	for range b.N {
		c0, s0, t0 := p.cpu(), procCPU(b, os.Getpid()), time.Now()
		time.Sleep(window) // the idle window
		c1, s1, t1 := p.cpu(), procCPU(b, os.Getpid()), time.Now()
		idle = append(idle, (c1-c0).Seconds()/t1.Sub(t0).Seconds())
		sims = append(sims, (s1-s0).Seconds()/t1.Sub(t0).Seconds())
		lat := paced(b, client, p.base, bodies, rate, window)
		c2, t2 := p.cpu(), time.Now()
		loaded = append(loaded, (c2-c1).Seconds()/t2.Sub(t1).Seconds())
		p50s, p99s = append(p50s, lat[len(lat)/2]), append(p99s, lat[len(lat)*99/100])
	}
	b.StopTimer()
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(idle), "idle-cores")
	b.ReportMetric(med(loaded), "at-1k/s-cores")
	b.ReportMetric(med(loaded)-med(idle), "decisions-cores-per-1k/s")
	b.ReportMetric(med(sims), "bench-process-idle-cores")
	b.ReportMetric(ms(median(p50s)), "client-p50-ms")
	b.ReportMetric(ms(median(p99s)), "client-p99-ms")
}

// paced posts bodies (round robin) to the decision API at rate a second
// for d and returns the round trips, sorted; any failure fails b.
func paced(b *testing.B, client *http.Client, base string, bodies []string, rate int, d time.Duration) []time.Duration {
	n := int(d.Seconds() * float64(rate))
	lat := make([]time.Duration, n)
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		if w := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); w > 0 {
			time.Sleep(w)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := client.Post(base+"/routing/v1/pick", "application/json", strings.NewReader(bodies[i%len(bodies)]))
			if err == nil {
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d: %s", resp.StatusCode, raw)
				}
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d decisions failed, the first: %v", n, firstErr.Load())
	}
	slices.Sort(lat)
	return lat
}

// BenchmarkPickerFanout: four picker processes following the same 1,000
// simulated sidecars (one model; full 65,536-block summaries, light churn
// as BenchmarkPickerSync). First one picker: every endpoint routable
// (every snapshot sent and loaded), then the sidecars' outbound bytes
// over a 10-s window; then three more started at once:
// their sync times (concurrent) and each picker's memory; then the
// outbound bytes with four; then one op is one picker killed and
// restarted with the other three running, to its full sync (the median
// reported).
func BenchmarkPickerFanout(b *testing.B) {
	const n, window = 1000, 10 * time.Second
	f := startSims(b, n, 1, lightChurn)
	first := startPicker(b, f.addrs)
	first.awaitRoutable(f, n, syncWithin)
	rate := func() float64 {
		s0, t0 := f.sent(), time.Now()
		time.Sleep(window) // the measurement window
		return float64(f.sent()-s0) / time.Since(t0).Seconds()
	}
	one := rate()
	s0 := f.sent()
	pickers := []*pickerProc{first}
	for range 3 {
		pickers = append(pickers, startPicker(b, f.addrs))
	}
	syncs := awaitSyncAll(b, pickers[1:], n)
	var routables []time.Duration // each from its start; checked one after another, so an upper bound but for the first
	for _, p := range pickers[1:] {
		routables = append(routables, p.awaitRoutable(f, n, 3*syncWithin)) // three loading at once on two cores
	}
	snapBytes := float64(f.sent()-s0) / 3
	four := rate()
	var rssMax, hwmMax float64
	for _, p := range pickers {
		rss, hwm := p.memory()
		rssMax, hwmMax = max(rssMax, rss), max(hwmMax, hwm)
	}
	var restarts, restartsRoutable []time.Duration
	b.ResetTimer()
	for i := range b.N {
		p := pickers[i%len(pickers)]
		p.restart()
		restarts = append(restarts, p.awaitSync(n, syncWithin))
		b.StopTimer()
		restartsRoutable = append(restartsRoutable, p.awaitRoutable(f, n, syncWithin))
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(ms(median(routables)), "3-at-once-routable-p50-ms")
	b.ReportMetric(ms(routables[len(routables)-1]), "3-at-once-routable-max-ms")
	b.ReportMetric(ms(median(restartsRoutable)), "restart-routable-p50-ms")
	b.ReportMetric(one/(1<<20), "sent-1-picker-MiB/s")
	b.ReportMetric(four/(1<<20), "sent-4-pickers-MiB/s")
	b.ReportMetric(snapBytes/(1<<20), "sync-sent-per-picker-MiB")
	b.ReportMetric(ms(median(syncs)), "3-at-once-sync-p50-ms")
	b.ReportMetric(ms(syncs[len(syncs)-1]), "3-at-once-sync-max-ms")
	b.ReportMetric(ms(median(restarts)), "restart-sync-p50-ms")
	b.ReportMetric(rssMax, "rss-max-MiB")
	b.ReportMetric(hwmMax, "hwm-max-MiB")
}

// awaitSyncAll polls pickers started together until each has applied n
// snapshots, and returns each's time from its start.
func awaitSyncAll(b *testing.B, ps []*pickerProc, n int) []time.Duration {
	b.Helper()
	out := make([]time.Duration, len(ps))
	left := len(ps)
	testnet.Await(b, syncWithin, 10*time.Millisecond, func() error {
		for i, p := range ps {
			if out[i] != 0 {
				continue
			}
			if v, err := p.snapshotsApplied(); err == nil && v >= float64(n) {
				out[i] = time.Since(p.started)
				left--
			}
		}
		if left > 0 {
			return fmt.Errorf("pickers not synced: %v", out)
		}
		return nil
	})
	slices.Sort(out)
	return out
}
