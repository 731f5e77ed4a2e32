package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/kvroute/kvroute/test/lab"
	"github.com/kvroute/kvroute/test/workload"
)

// syntheticResults is a three-policy result (two of kvroute's, a peer's)
// with every chart's data, and a scenario name that would break out of a
// script element if unescaped.
func syntheticResults() *Results {
	r := &Results{Scenario: `x</script><script>alert(1)</script>`, Seed: 3, PooledBoundHitRate: 0.8, WarmReturnChance: 0.5,
		Policies: map[string]*PolicyResult{}, Order: []string{"round-robin", "precise", "dynamo"}}
	r.Fleet.Engines, r.Fleet.GPUBlocksPerEngine, r.Fleet.BlockSize = 2, 128, 16
	for i, p := range r.Order {
		pr := &PolicyResult{Requests: 10, HitRate: 0.2 + 0.25*float64(i), TTFTms: Quantiles{Mean: 100, P50: 90, P90: 150, P99: 200 - 20*float64(i)},
			Continuations: 4, WarmReturns: 2 * i, WarmReturnRate: float64(2*i) / 4,
			PickOverheadUs: PickOverhead{Samples: 10, Mean: 180, P50Bound: 250, P99Bound: 1e6, P99Beyond: true, Note: pickOverheadNote},
			Timeline:       &Timeline{Seconds: []float64{0, 1, 2}},
			HitRateOverTime: &HitRateSeries{Seconds: []float64{0.25, 0.75, 1.75}, HitRate: []float64{0, 0.3 * float64(i), 0.4 * float64(i)},
				Requests: []int{2, 5, 3}}}
		for q := 0; q <= 100; q++ {
			pr.TTFTPercentiles = append(pr.TTFTPercentiles, float64(10*q+100*(1-i)))
		}
		for e := 0; e < 2; e++ {
			pr.Timeline.Engines = append(pr.Timeline.Engines, EngineTimeline{URL: fmt.Sprint("http://e", e),
				Requests: []int{0, 3, 5}, CachedBlocks: []int{0, 40, 90}, Queued: []int{0, 1, 0}})
		}
		r.Policies[p] = pr
	}
	r.VsBestPeer = ComparePeers(r)
	rec := 7.0
	one, zero := 1, 0
	r.Faults = &FaultsResult{Rule: ClassificationRule, Requests: 40, RouterFailed: 0, UnavoidableFailed: 1, WindowSeconds: 30,
		Faults: []FaultResult{
			{Name: "engine-sigkill", Target: "http://e1", Injected: 40, Restored: 45, UnavoidableFailed: 1, InFlight: &one, InFlightFailed: &one,
				HitRateBefore: 0.8, HitRateAfter: 0.7, Recovery: &rec, Outcomes: map[string]int{"as_predicted": 9, "more_cached_than_predicted": 1}, AsPredicted: 0.9},
			{Name: "picker-sigterm", Target: "http://p0", Injected: 90, Restored: 93, InFlight: &one, InFlightFailed: &zero,
				HitRateBefore: 0.8, HitRateAfter: 0.8, Outcomes: map[string]int{}}},
		Timeline: FaultTimeline{Seconds: []float64{2.5, 42.5, 92.5, 122.5}, HitRate: []float64{0.1, 0.6, 0.8, 0.8}, Requests: []int{3, 10, 12, 15},
			Router: []int{0, 0, 0, 0}, Unavoidable: []int{0, 1, 0, 0}}}
	r.Policies["precise"].Phases = []PhaseResult{{Phase: "overload", Tenant: "t1", Load: 4, Requests: 100, OK: 30, Shed: 70, ShedWithRetryAfter: 70,
		TTFT: Quantiles{P50: 600, P99: 1234}}}
	r.Policies["precise"].Resources = &ResourceReport{Note: "synthetic samples", EverySeconds: 2, Components: []ComponentResource{
		{Name: "picker-0", Kind: "picker", T: []float64{0, 2, 4}, RSSMiB: []float64{30, 31, 31}, Goroutines: []int{40, -1, 41}},
		{Name: "sidecar-0", Kind: "sidecar", T: []float64{0, 2, 4}, RSSMiB: []float64{20, 20, 21}, Goroutines: []int{30, 30, 30}}}}
	return r
}

// TestReportContents checks the page without a browser: self-contained
// (Chart.js inline, nothing fetched), the table's rows, and the results
// escaped inside the script.
func TestReportContents(t *testing.T) {
	var b bytes.Buffer
	if err := WriteReport(&b, syntheticResults()); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{"Chart.js v4", "<td>precise</td>", "<td>round-robin</td>", "<td>dynamo</td>", "45.0%", "80.0%", `"ttft_percentiles_ms"`,
		`"hit_rate_over_time"`, "Against the best peer", "<td>dynamo: 70.0%</td>", "<td>0.64×</td>", "<td>1.25×</td>", "bucket bounds",
		"≤ 250 µs / &gt; 1000000 µs", "<td>2.00×</td>", "requests in flight per engine",
		"<b>0 failed by the router</b>", "<td>engine-sigkill</td>", "<td>1 of 1</td>", "<td>7 s</td>", "not back", "Rule: a failed request is unavoidable",
		"Memory and goroutines over time", "synthetic samples", `"router_failed"`, `"unavoidable_failed"`, `"rss_mib"`,
		"Phases: precise", "<td>overload</td><td>t1</td><td>4.00×</td><td>100</td><td>30</td><td>70</td>", "<td>1234 ms</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	for _, bad := range []string{"<script>alert(1)", "src=\"http", "href=\"http", "<script src="} {
		if strings.Contains(page, bad) {
			t.Errorf("report contains %q", bad)
		}
	}
}

// TestReportInChromium opens a report in headless Chromium: every chart
// drew on its canvas, Chart.js holds the expected datasets, and the page
// logged no error; a screenshot is kept in the artifacts folder.
func TestReportInChromium(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "report.html")
	var b bytes.Buffer
	r := syntheticResults()
	// A short lab sweep of the demo: two policies, a seed, two rates.
	lr, err := lab.RunSweep(lab.Sweep{Scenario: workload.Demo(), Policies: []string{"precise", "dynamo"}, Seeds: []uint64{1},
		Rates: []float64{1, 2}, Fleet: lab.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	r.Lab = lr
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// The three charts, two timelines per policy, the faults timeline, the
	// memory and goroutine charts, and the lab's four (TTFT p50 and p90 and
	// hit rate against the offered rate, goodput).
	checkReportInChromium(t, path, "report-synthetic.png", 3+2*3+1+2+4)
}

// checkReportInChromium loads the report at path and checks that charts
// canvases were drawn by Chart.js with data, without console errors or
// exceptions; the full-page screenshot is saved as artifact name.
func checkReportInChromium(t *testing.T, path, name string, charts int) {
	t.Helper()
	exe := chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	cctx, cancelTab := chromedp.NewContext(actx)
	defer cancelTab()

	var mu sync.Mutex
	var problems []string
	err := chromedp.Listen(cctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			problems = append(problems, (&chromedp.ExceptionError{ExceptionDetails: ev.ExceptionDetails}).Error())
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				problems = append(problems, "console."+string(ev.Type)+": "+strings.Join(args, " "))
			}
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.EntryLevelError {
				problems = append(problems, "log: "+ev.Entry.Text+" "+ev.Entry.URL)
			}
		}
	})
	if err != nil {
		t.Fatalf("start Chromium (%s): %v", exe, err)
	}
	if _, err := chromedp.Call(cctx, log.Enable, struct{}{}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(cctx, chromedp.Navigate("file://"+path), chromedp.WaitReady("body")); err != nil {
		t.Fatal(err)
	}
	type canvas struct {
		ID, Policy      string
		Painted, Points int
		Chart           bool
	}
	got, err := chromedp.Run(cctx, chromedp.Evaluate[[]canvas](`Array.from(document.querySelectorAll("canvas")).map(c => {
		const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
		let painted = 0;
		for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) painted++;
		const ch = Chart.getChart(c);
		return { ID: c.id, Policy: c.dataset.policy || "", Painted: painted, Chart: !!ch,
		         Points: ch ? ch.data.datasets.reduce((n, d) => n + d.data.length, 0) : 0 };
	})`))
	if err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(cctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifacts(t), name)
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)

	if len(got) != charts {
		t.Errorf("%d canvases, want %d: %+v", len(got), charts, got)
	}
	for _, c := range got {
		// A drawn chart covers thousands of pixels (axes, labels, bars or
		// lines); an empty canvas none.
		if !c.Chart || c.Points == 0 || c.Painted < 2000 {
			t.Errorf("canvas %q (policy %q) not drawn: %+v", c.ID, c.Policy, c)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("page error: %s", p)
	}
}

// chromium finds the browser: $CHROMIUM, else chromium on PATH (make deps
// installs it).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium on PATH (chromium); `make deps` installs it, or set CHROMIUM")
	return ""
}

// artifacts is the folder for files a test keeps: $KVROUTE_ARTIFACTS, else
// artifacts/ at the module's root.
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("KVROUTE_ARTIFACTS")
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		for d := wd; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				dir = filepath.Join(d, "artifacts")
				break
			} else if !errors.Is(err, os.ErrNotExist) || filepath.Dir(d) == d {
				t.Fatalf("no go.mod above %s", wd)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPercentiles checks nearest-rank percentiles and quantiles against a
// direct count: the p-th percentile is the smallest value with at least p%
// of the values at or below it.
func TestPercentiles(t *testing.T) {
	for n := 1; n <= 300; n++ {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(n - i) // reversed: sorting matters
		}
		ps := percentiles(v)
		for p, got := range ps {
			// The rank r = ⌈p·n/100⌉ (at least 1) is the value r here.
			want := float64(max(1, (p*n+99)/100))
			if got != want {
				t.Fatalf("n=%d p%d: %v, want %v", n, p, got, want)
			}
			if below := int(got); p > 0 && 100*below < p*n {
				t.Fatalf("n=%d p%d: only %d values ≤ %v", n, p, below, got)
			}
		}
		q := quantiles(v)
		if q.P50 != ps[50] || q.P90 != ps[90] || q.P99 != ps[99] || q.Mean != float64(n+1)/2 {
			t.Fatalf("n=%d: quantiles %+v vs percentiles %v %v %v", n, q, ps[50], ps[90], ps[99])
		}
	}
	if percentiles(nil) != nil || quantiles(nil) != (Quantiles{}) {
		t.Fatal("empty input")
	}
}
