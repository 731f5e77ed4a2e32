package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Soak figures: the memory and goroutines of the pickers and sidecars,
// sampled through a run (results.json per policy "resources").

// ResourceReport is every component's samples and growth.
type ResourceReport struct {
	// Note says where the figures come from.
	Note         string              `json:"note"`
	EverySeconds float64             `json:"every_s"` // the sampling period (wall time)
	Components   []ComponentResource `json:"components"`
}

// ComponentResource is one component's samples (wall seconds since the
// start) and growth. RSS is the resident set in MiB; Goroutines
// go_goroutines from its /metrics (absent when it does not export it).
type ComponentResource struct {
	Name   string    `json:"name"`
	Kind   string    `json:"kind"`   // picker, sidecar, process (the whole bench process)
	Source string    `json:"source"` // where RSS and goroutines come from
	T      []float64 `json:"t_s"`
	RSSMiB []float64 `json:"rss_mib"`
	// Goroutines are parallel to T; absent (null) when the component
	// does not export go_goroutines; -1 where one scrape failed.
	Goroutines []int `json:"goroutines,omitempty"`
	// Restarts are the times the process id changed (a restart).
	Restarts []float64 `json:"restarts_s,omitempty"`
	Growth   Growth    `json:"growth"`
}

// Growth compares the run's start with its end: the median RSS of the
// first minute of samples against that of the last minute (the first and
// last third when the run is shorter than two minutes), and the median
// goroutines of the same spans.
type Growth struct {
	SpanSeconds      float64  `json:"span_s"`
	RSSFirstMiB      float64  `json:"rss_first_mib"`
	RSSLastMiB       float64  `json:"rss_last_mib"`
	RSSGrowth        float64  `json:"rss_growth"` // last ÷ first − 1
	GoroutinesStart  *float64 `json:"goroutines_start,omitempty"`
	GoroutinesEnd    *float64 `json:"goroutines_end,omitempty"`
	GoroutinesGrowth *float64 `json:"goroutines_growth,omitempty"` // end ÷ start − 1
}

// resourceSource is a component to sample: pid returns its process id (0
// while it is down); metrics is its /metrics URL ("" for none).
type resourceSource struct {
	name, kind string
	pid        func() int
	metrics    string
	self       bool // this process: RSS and runtime.NumGoroutine
}

// resourcePeriod is the sampling period: every, else 2 s.
func resourcePeriod(every time.Duration) time.Duration {
	if every <= 0 || every < time.Second {
		return 2 * time.Second
	}
	return every
}

// sampleResources samples the components every period until ctx ends,
// halving the samples kept (every other one) past 900.
func sampleResources(ctx context.Context, comps []resourceSource, start time.Time, period time.Duration) *ResourceReport {
	r := &ResourceReport{EverySeconds: period.Seconds(),
		Note: "processes: RSS is VmRSS from /proc/<pid>/status, goroutines go_goroutines from the component's /metrics; " +
			"in-process: the bench process's own VmRSS and runtime.NumGoroutine, for everything it runs (engines, sidecars, picker, load)"}
	last := make([]int, len(comps))
	exports := make([]bool, len(comps))
	for _, c := range comps {
		src := "VmRSS of the process (/proc/<pid>/status); go_goroutines from its /metrics"
		if c.self {
			src = "this bench process (in-process fleet): VmRSS of /proc/self/status; runtime.NumGoroutine()"
		}
		r.Components = append(r.Components, ComponentResource{Name: c.name, Kind: c.kind, Source: src})
	}
	take := func() {
		t := time.Since(start).Seconds()
		for i, c := range comps {
			cr := &r.Components[i]
			pid := 0
			if c.self {
				pid = os.Getpid()
			} else if c.pid != nil {
				pid = c.pid()
			}
			if pid == 0 {
				continue // down
			}
			rss, err := vmRSS(pid)
			if err != nil {
				continue
			}
			if last[i] != 0 && pid != last[i] {
				cr.Restarts = append(cr.Restarts, t)
			}
			last[i] = pid
			g := -1
			switch {
			case c.self:
				g = runtime.NumGoroutine()
			case c.metrics != "":
				if v, err := scrapeCounter(ctx, c.metrics, "go_goroutines", ""); err == nil {
					if n, ok := v[""]; ok {
						g, exports[i] = int(n), true
					}
				}
			}
			cr.T, cr.RSSMiB, cr.Goroutines = append(cr.T, t), append(cr.RSSMiB, rss), append(cr.Goroutines, g)
			if len(cr.T) > 900 {
				cr.T, cr.RSSMiB, cr.Goroutines = everyOther(cr.T), everyOther(cr.RSSMiB), everyOther(cr.Goroutines)
			}
		}
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		take()
		select {
		case <-ctx.Done():
			for i := range r.Components {
				cr := &r.Components[i]
				if !exports[i] && !comps[i].self {
					cr.Goroutines = nil
					cr.Source = "VmRSS of the process (/proc/<pid>/status); goroutines not exported (no go_goroutines on its /metrics)"
				}
				cr.Growth = growth(cr.T, cr.RSSMiB, cr.Goroutines)
			}
			return r
		case <-tick.C:
		}
	}
}

// vmRSS reads a process's resident set in MiB.
func vmRSS(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fs := strings.Fields(v)
			if len(fs) < 1 {
				break
			}
			kb, err := strconv.ParseFloat(fs[0], 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// growth computes Growth from samples at t (seconds): the spans are the
// first and the last minute, or thirds of the run when it is shorter than
// two minutes; goroutine samples of -1 (failed scrapes) are left out.
func growth(t, rss []float64, gor []int) Growth {
	var g Growth
	if len(t) == 0 {
		return g
	}
	first, last := t[0], t[len(t)-1]
	span := 60.0
	if last-first < 120 {
		span = (last - first) / 3
	}
	g.SpanSeconds = span
	var a, b []float64
	var ga, gb []float64
	for i, x := range t {
		if x <= first+span {
			a = append(a, rss[i])
			if i < len(gor) && gor[i] >= 0 {
				ga = append(ga, float64(gor[i]))
			}
		}
		if x >= last-span {
			b = append(b, rss[i])
			if i < len(gor) && gor[i] >= 0 {
				gb = append(gb, float64(gor[i]))
			}
		}
	}
	g.RSSFirstMiB, g.RSSLastMiB = median(a), median(b)
	if g.RSSFirstMiB > 0 {
		g.RSSGrowth = g.RSSLastMiB/g.RSSFirstMiB - 1
	}
	if len(ga) > 0 && len(gb) > 0 {
		s, e := median(ga), median(gb)
		g.GoroutinesStart, g.GoroutinesEnd = &s, &e
		if s > 0 {
			gr := e/s - 1
			g.GoroutinesGrowth = &gr
		}
	}
	return g
}

// median of v (0 when empty).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// resourcesTable is summary.txt's resources block, for runs with
// --duration ("" otherwise).
func resourcesTable(r *Results) string {
	var b strings.Builder
	if r.DurationSeconds <= 0 {
		return ""
	}
	fmt.Fprintf(&b, "\nresources over %.0f s (RSS: median of the first vs the last span; goroutines likewise)\n", r.DurationSeconds)
	fmt.Fprintf(&b, "%-13s %-12s %8s %10s %10s %8s %11s %9s %8s\n", "policy", "component", "span (s)", "RSS first", "RSS last", "growth", "goroutines", "growth", "restarts")
	for _, p := range r.Order {
		res := r.Policies[p].Resources
		if res == nil {
			continue
		}
		for _, c := range res.Components {
			g := c.Growth
			gor, ggr := "not exported", "-"
			if g.GoroutinesStart != nil {
				gor = fmt.Sprintf("%.0f → %.0f", *g.GoroutinesStart, *g.GoroutinesEnd)
			}
			if g.GoroutinesGrowth != nil {
				ggr = fmt.Sprintf("%+.1f%%", 100**g.GoroutinesGrowth)
			}
			fmt.Fprintf(&b, "%-13s %-12s %8.0f %7.1f MiB %7.1f MiB %+7.1f%% %11s %9s %8d\n", p, c.Name, g.SpanSeconds, g.RSSFirstMiB, g.RSSLastMiB,
				100*g.RSSGrowth, gor, ggr, len(c.Restarts))
		}
	}
	return b.String()
}
