package workload_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/workload"
)

// tenantCounts drives p and counts its requests by phase and tenant.
func tenantCounts(t *testing.T, p workload.Plan) (map[string]int, []sentRequest) {
	t.Helper()
	reqs := drivePlan(t, p, false)
	n := map[string]int{}
	for _, r := range reqs {
		n[fmt.Sprintf("%d/%s", r.req.Step, r.req.Tenant)]++
	}
	return n, reqs
}

// withinPoisson: a count of a Poisson process is within four standard
// deviations of its mean.
func withinPoisson(got int, mean float64) bool {
	return math.Abs(float64(got)-mean) <= 4*math.Sqrt(mean)
}

// TestTenantsPlan draws the tenants scenario at its defaults (seed 1)
// and checks what its doc comment states: the fleet, the phases, the
// tenants' loads per phase (0.25× and 2.5× a capacity of 10 requests a
// second), the prompts (a 256-token prefix per tenant, salted per
// tenant, and 2,000 tokens of their own), the labels, and that every
// request is sent within its phase.
func TestTenantsPlan(t *testing.T) {
	sc := workload.Tenants{}
	f := sc.Fleet()
	if f.Engines != 2 || f.GPUBlocks != 2048 || f.CPUBlocks != 0 || f.Profile != "" || sc.SLO() != time.Second {
		t.Fatalf("fleet %+v, SLO %v", f, sc.SLO())
	}
	sim, err := profile.Named(profile.SimDefault)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * sim.PrefillTokensPerSecond / 2000; sc.Capacity() != want || want != 10 {
		t.Fatalf("capacity %v, want %v (sim-default's prefill ÷ 2,000 tokens, two engines)", sc.Capacity(), want)
	}
	if ph := sc.Phases(); len(ph) != 2 || ph[0] != (workload.Phase{Name: "alone", For: 30 * time.Second}) ||
		ph[1] != (workload.Phase{Name: "contended", For: 60 * time.Second}) {
		t.Fatalf("phases %+v", ph)
	}
	p, err := sc.Plan(workload.Options{Seed: 1, Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	shape, reqs := measurePlan(t, p)
	t.Logf("tenants: %v", shape)
	prefixes := map[string]string{}
	convs := map[int]bool{}
	counts := map[string]int{}
	for i, r := range reqs {
		b, q := r.body, r.req
		counts[fmt.Sprintf("%d/%s", q.Step, q.Tenant)]++
		if q.Tenant != "light" && q.Tenant != "heavy" || q.Step < 1 || q.Step > 2 || q.Step == 1 && q.Tenant == "heavy" {
			t.Fatalf("request %d: tenant %q in step %d", i, q.Tenant, q.Step)
		}
		if q.Path != "/v1/completions" || q.Turn != 1 || convs[q.Conversation] || b.CacheSalt != "salt-"+q.Tenant || b.MaxTokens != 8 || !b.IgnoreEOS {
			t.Fatalf("request %d: path %s, conversation %d turn %d, salt %q, max_tokens %d, ignore_eos %v", i, q.Path, q.Conversation, q.Turn,
				b.CacheSalt, b.MaxTokens, b.IgnoreEOS)
		}
		convs[q.Conversation] = true
		if r.prompt < 2256 || r.prompt > 2256+32 {
			t.Fatalf("request %d: a prompt of %d tokens, want 256 + 2,000 and a few", i, r.prompt)
		}
		from := time.Duration(q.Step-1) * 30 * time.Second
		if r.start < from || r.start >= from+[]time.Duration{30 * time.Second, 60 * time.Second}[q.Step-1] {
			t.Fatalf("request %d of step %d sent at %v, outside its phase", i, q.Step, r.start)
		}
		if i > 0 && r.start < reqs[i-1].start {
			t.Fatalf("request %d sent at %v, before the one before it (%v)", i, r.start, reqs[i-1].start)
		}
		prompt := b.Prompt.(string)
		head, _, ok := strings.Cut(prompt, "Request ")
		if !ok || !strings.HasPrefix(head, "Tenant "+q.Tenant+" shared instructions. ") {
			t.Fatalf("request %d: prompt %.80q…", i, prompt)
		}
		if was, ok := prefixes[q.Tenant]; ok && was != head {
			t.Fatalf("request %d: tenant %s's prefix changed", i, q.Tenant)
		}
		prefixes[q.Tenant] = head
	}
	// Two prefixes (one per tenant's salt); every request shares its
	// tenant's.
	if shape.prefixes != 2 || shape.shared != 1 {
		t.Fatalf("%d distinct first blocks, %.2f shared: want 2, all", shape.prefixes, shape.shared)
	}
	for k, mean := range map[string]float64{"1/light": 2.5 * 30, "2/light": 2.5 * 60, "2/heavy": 25 * 60} {
		if !withinPoisson(counts[k], mean) {
			t.Errorf("%s: %d requests, want ≈ %.0f", k, counts[k], mean)
		}
	}
	if len(counts) != 3 {
		t.Errorf("counts %v: want light alone, light and heavy contended", counts)
	}
}

// TestTenantsRates: on a shape with many short requests (one engine,
// 200-token prompts: a capacity of 50 a second), the rates per phase and
// tenant are within 10% of the loads', at Rate 1 and at Rate 2 (which
// doubles them, the phases keeping their lengths).
func TestTenantsRates(t *testing.T) {
	sc := workload.Tenants{Engines: 1, UniqueTokens: 200, SharedTokens: 16, Alone: 160 * time.Second, Contended: 16 * time.Second}
	if sc.Capacity() != 50 {
		t.Fatalf("capacity %v, want 50", sc.Capacity())
	}
	for _, rate := range []float64{1, 2} {
		p, err := sc.Plan(workload.Options{Seed: 2, Rate: rate})
		if err != nil {
			t.Fatal(err)
		}
		counts, reqs := tenantCounts(t, p)
		for k, x := range map[string]struct{ load, secs float64 }{"1/light": {0.25, 160}, "2/light": {0.25, 16}, "2/heavy": {2.5, 16}} {
			got, want := float64(counts[k])/x.secs, x.load*50*rate
			tol := 0.1
			if k == "2/light" {
				tol = 0.25 // ≈ 200 requests
			}
			if !withinFrac(got, want, tol) {
				t.Errorf("rate %v, %s: %.1f requests a second, want %.1f", rate, k, got, want)
			}
		}
		last := reqs[len(reqs)-1].start
		if last >= 176*time.Second || last < 175*time.Second {
			t.Errorf("rate %v: the last request at %v, want within the contended phase's last second", rate, last)
		}
	}
}

// TestTenantsDeterminism: a seed is one plan (the same requests, bodies
// and starts); another seed another.
func TestTenantsDeterminism(t *testing.T) {
	sc := workload.Tenants{Alone: 10 * time.Second, Contended: 4 * time.Second}
	run := func(seed uint64) ([32]byte, []time.Duration) {
		p, err := sc.Plan(workload.Options{Seed: seed, Rate: 1})
		if err != nil {
			t.Fatal(err)
		}
		var starts []time.Duration
		for _, s := range p.Sessions {
			starts = append(starts, s.Start)
		}
		return planDigest(drivePlan(t, p, false)), starts
	}
	a, sa := run(7)
	b, sb := run(7)
	if a != b || !slices.Equal(sa, sb) {
		t.Fatal("seed 7 twice: different plans")
	}
	c, sc8 := run(8)
	if a == c || slices.Equal(sa, sc8) {
		t.Fatal("seeds 7 and 8: the same plan")
	}
}

// TestTenantsErrors: a bad rate, a context too short and a bad shape
// fail the plan; the scenario is registered.
func TestTenantsErrors(t *testing.T) {
	for _, rate := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if _, err := (workload.Tenants{}).Plan(workload.Options{Seed: 1, Rate: rate}); err == nil {
			t.Errorf("rate %v accepted", rate)
		}
	}
	if _, err := (workload.Tenants{}).Plan(workload.Options{Seed: 1, Rate: 1, MaxModelLen: 2048}); err == nil || !strings.Contains(err.Error(), "fit") {
		t.Errorf("context 2048: %v", err)
	}
	if _, err := (workload.Tenants{Light: -1}).Plan(workload.Options{Seed: 1, Rate: 1}); err == nil {
		t.Error("a negative load accepted")
	}
	sc, err := workload.Named("tenants", workload.NamedOptions{})
	if err != nil || !slices.Contains(workload.Names(), "tenants") {
		t.Fatalf("tenants: %v, %v", sc, err)
	}
	if _, ok := sc.(workload.Phased); !ok {
		t.Fatal("tenants is not Phased")
	}
}
