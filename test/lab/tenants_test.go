package lab

import (
	"bytes"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/workload"
)

// smallTenants is the tenants scenario in short: 6 s alone, 8 s
// contended (≈ 15 + 220 requests), the contended phase still 2.75× the
// fleet's capacity.
var smallTenants = workload.Tenants{Alone: 6 * time.Second, Contended: 8 * time.Second}

// TestTenantTable: a sweep of a scenario whose requests have tenants
// reports, per run and as the median over the seeds, each phase and
// tenant's requests, answers, TTFTs and throughput; its outcomes carry
// their tenants; and with the engines' priority policy the light
// tenant's p99 beside the heavy one is lower than without, on every
// seed (a property of these small deterministic runs, not a timing).
func TestTenantTable(t *testing.T) {
	cfg := DefaultConfig()
	outs, err := Run(cfg, smallTenants, workload.Options{Seed: 1, Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		if o.Tenant != "light" && o.Tenant != "heavy" || o.Step == 1 && o.Tenant != "light" {
			t.Fatalf("outcome of step %d with tenant %q", o.Step, o.Tenant)
		}
	}
	seeds := []uint64{1, 2}
	var res [2]*Results
	for i, prio := range []bool{false, true} {
		fl := DefaultConfig()
		fl.EnginePriority = prio
		r, err := RunSweep(Sweep{Scenario: smallTenants, Policies: []string{"precise"}, Seeds: seeds, Fleet: fl, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		res[i] = r
		table := Table(r)
		t.Log("\n" + table)
		if r.EnginePriority != prio || strings.Contains(table, "engine priority") != prio || !strings.Contains(table, "per phase and tenant") ||
			strings.Count(table, "precise  median") != 3 {
			t.Fatalf("engine priority %v, table:\n%s", r.EnginePriority, table)
		}
		for _, run := range r.Runs {
			f := run.Figures
			if len(f.Tenants) != 3 {
				t.Fatalf("seed %d: %d rows, want alone/light, contended/heavy, contended/light: %+v", run.Seed, len(f.Tenants), f.Tenants)
			}
			want := []struct {
				step          int
				phase, tenant string
				window        float64
			}{{1, "alone", "light", 6}, {2, "contended", "heavy", 8}, {2, "contended", "light", 8}}
			sum := 0
			for k, tp := range f.Tenants {
				w := want[k]
				if tp.Step != w.step || tp.Phase != w.phase || tp.Tenant != w.tenant || float64(tp.WindowS) != w.window {
					t.Fatalf("seed %d row %d: %+v, want %+v", run.Seed, k, tp, w)
				}
				if tp.Requests == 0 || tp.Answered != tp.Requests || !(tp.TTFTP50 > 0 && tp.TTFTP99 >= tp.TTFTP50) ||
					!(tp.Throughput > 0 && float64(tp.Throughput) <= float64(tp.Answered)/w.window) {
					t.Fatalf("seed %d row %d: %+v", run.Seed, k, tp)
				}
				sum += tp.Requests
			}
			if sum != f.Requests || f.Tenants[0].TTFTP99VsFirst != 1 || f.Tenants[2].TTFTP99VsFirst != f.Tenants[2].TTFTP99/f.Tenants[0].TTFTP99 {
				t.Fatalf("seed %d: rows of %d requests of %d; %+v", run.Seed, sum, f.Requests, f.Tenants)
			}
		}
		// The medians of two seeds: the means of their figures.
		if len(r.Tenants) != 3 {
			t.Fatalf("%d summary rows: %+v", len(r.Tenants), r.Tenants)
		}
		for k, s := range r.Tenants {
			a, b := r.Runs[0].Figures.Tenants[k], r.Runs[1].Figures.Tenants[k]
			if s.Policy != "precise" || s.Rate != 1 || s.Seeds != 2 || s.Step != a.Step || s.Tenant != a.Tenant || s.Phase != a.Phase ||
				s.TTFTP99 != (a.TTFTP99+b.TTFTP99)/2 || s.Throughput != (a.Throughput+b.Throughput)/2 || float64(s.Requests) != float64(a.Requests+b.Requests)/2 {
				t.Fatalf("summary %+v from %+v and %+v", s, a, b)
			}
		}
	}
	for i := range seeds {
		fcfs, prio := res[0].Runs[i].Figures.Tenants, res[1].Runs[i].Figures.Tenants
		if !(prio[2].TTFTP99 < fcfs[2].TTFTP99) {
			t.Errorf("seed %d: the light tenant's contended p99 %v ms with engine priority, %v ms without: want lower", seeds[i], prio[2].TTFTP99, fcfs[2].TTFTP99)
		}
		t.Logf("seed %d: light p99 alone %.0f / %.0f ms, contended %.0f / %.0f ms; heavy %.2f / %.2f a second (first come first served / priority)", seeds[i],
			fcfs[0].TTFTP99, prio[0].TTFTP99, fcfs[2].TTFTP99, prio[2].TTFTP99, fcfs[1].Throughput, prio[1].Throughput)
	}
}

// TestNoTenantTable: a scenario without tenants has no tenant table, in
// results.json or in the summary, and no engine_priority unless set.
func TestNoTenantTable(t *testing.T) {
	r, err := RunSweep(Sweep{Scenario: convos{n: 4, turns: 2, engines: 2}, Policies: []string{"precise"}, Seeds: []uint64{1}, Fleet: DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(`"tenant`)) || bytes.Contains(b, []byte("engine_priority")) || r.Runs[0].Figures.Tenants != nil ||
		strings.Contains(Table(r), "tenant") {
		t.Fatalf("a tenant table without tenants:\n%s", b)
	}
}

// TestTenantPhases: the table by step and tenant from outcomes — the
// phases' windows when the scenario has them, else from a step's first
// send to the next step's (the last: to the run's last answer); failures
// counted as requests, not answers; a tenant with no answer has no TTFT.
func TestTenantPhases(t *testing.T) {
	s := time.Second
	outs := []Outcome{
		{Step: 1, Tenant: "a", Status: http.StatusOK, Start: 1 * s, TTFT: 100 * time.Millisecond, End: 2 * s},
		{Step: 1, Tenant: "a", Status: http.StatusOK, Start: 3 * s, TTFT: 300 * time.Millisecond, End: 12 * s}, // answered after phase 1
		{Step: 2, Tenant: "a", Status: http.StatusOK, Start: 11 * s, TTFT: 600 * time.Millisecond, End: 13 * s},
		{Step: 2, Tenant: "b", Status: http.StatusOK, Start: 12 * s, TTFT: 200 * time.Millisecond, End: 14 * s},
		{Step: 2, Tenant: "b", Status: http.StatusTooManyRequests, Start: 13 * s, End: 13 * s},
		{Step: 2, Tenant: "c", Status: http.StatusBadGateway, Start: 14 * s, End: 14 * s},
	}
	if tenantPhases(outs[:0], nil) != nil || tenantPhases([]Outcome{{Step: 1, Status: http.StatusOK, End: s}}, nil) != nil {
		t.Fatal("a table without tenants")
	}
	got := tenantPhases(outs, []workload.Phase{{Name: "p1", For: 10 * s}, {Name: "p2", For: 20 * s}})
	want := []TenantPhase{
		{Step: 1, Phase: "p1", Tenant: "a", Requests: 2, Answered: 2, TTFTP50: 100, TTFTP99: 300, TTFTP99VsFirst: 1, Throughput: 0.1, WindowS: 10},
		{Step: 2, Phase: "p2", Tenant: "a", Requests: 1, Answered: 1, TTFTP50: 600, TTFTP99: 600, TTFTP99VsFirst: 2, Throughput: 0.05, WindowS: 20},
		{Step: 2, Phase: "p2", Tenant: "b", Requests: 2, Answered: 1, TTFTP50: 200, TTFTP99: 200, TTFTP99VsFirst: 1, Throughput: 0.05, WindowS: 20},
	}
	if len(got) != 4 || !sameRows(got[:3], want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if c := got[3]; c.Tenant != "c" || c.Answered != 0 || !math.IsNaN(float64(c.TTFTP99)) || !math.IsNaN(float64(c.TTFTP99VsFirst)) || c.Throughput != 0 {
		t.Fatalf("a tenant without answers: %+v", c)
	}
	// Without phases: step 1 from 1 s to step 2's first send (11 s),
	// step 2 from 11 s to the last answer (14 s).
	got = tenantPhases(outs, nil)
	if got[0].WindowS != 10 || got[0].Throughput != 0.1 || got[0].Phase != "" || got[1].WindowS != 3 || got[1].Throughput != Num(1.0/3) {
		t.Fatalf("without phases: %+v", got)
	}
}

func sameRows(a, b []TenantPhase) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Step != y.Step || x.Phase != y.Phase || x.Tenant != y.Tenant || x.Requests != y.Requests || x.Answered != y.Answered ||
			x.TTFTP50 != y.TTFTP50 || x.TTFTP99 != y.TTFTP99 || x.TTFTP99VsFirst != y.TTFTP99VsFirst || x.WindowS != y.WindowS ||
			math.Abs(float64(x.Throughput-y.Throughput)) > 1e-12 {
			return false
		}
	}
	return true
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		v    []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{math.NaN(), 5}, 5}, {[]float64{7}, 7}} {
		if got := median(c.v); got != c.want {
			t.Errorf("median %v = %v, want %v", c.v, got, c.want)
		}
	}
	if !math.IsNaN(median(nil)) || !math.IsNaN(median([]float64{math.NaN()})) {
		t.Error("the median of nothing is not NaN")
	}
}
