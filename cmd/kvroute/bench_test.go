package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/bench"
)

// TestBenchPolicies checks --policies with peers' names (llm-d-calibrated
// too), --peers' expansion (the four peers, llm-d twice, precise,
// round-robin) and that the two do not mix.
func TestBenchPolicies(t *testing.T) {
	b := benchFlags{policies: "llm-d, dynamo,precise,llm-d-calibrated"}
	ps, err := b.policyList(true)
	if err != nil || !slices.Equal(ps, []score.Policy{score.LLMD, score.Dynamo, score.Precise, bench.LLMDCalibrated}) {
		t.Fatalf("%v %v", ps, err)
	}
	if _, err := (&benchFlags{policies: "llm-d-calibrated,llm-d-calibrated"}).policyList(true); err == nil {
		t.Fatal("llm-d-calibrated twice was accepted")
	}
	b = benchFlags{policies: "round-robin,least-loaded,prefix-hash,precise", peers: true}
	ps, err = b.policyList(false)
	want := []score.Policy{score.LLMD, bench.LLMDCalibrated, score.LLMDPrecise, score.Dynamo, score.SGLang, score.Precise, score.RoundRobin}
	if err != nil || !slices.Equal(ps, want) {
		t.Fatalf("--peers: %v %v", ps, err)
	}
	for _, p := range score.PeerPolicies() {
		if !slices.Contains(ps, p) {
			t.Errorf("--peers lacks %s", p)
		}
	}
	b = benchFlags{policies: "precise", peers: true}
	if _, err := b.policyList(true); err == nil || !strings.Contains(err.Error(), "--peers") {
		t.Fatalf("--peers with --policies: %v", err)
	}
	b = benchFlags{policies: "precise,nope"}
	if _, err := b.policyList(true); err == nil {
		t.Fatal("an unknown policy was accepted")
	}
}

// TestBenchScenarios checks seed-continuation's two forms and that
// --sequential belongs to it alone.
func TestBenchScenarios(t *testing.T) {
	b := benchFlags{scenario: "seed-continuation"}
	if sc, err := b.buildScenario(); err != nil || sc.Name() != "seed-continuation" {
		t.Fatalf("%v %v", sc, err)
	} else if _, ok := sc.(bench.SeedConcurrent); !ok || sc.Fleet().Engines < 4 {
		t.Fatalf("the default form: %T on %d engines", sc, sc.Fleet().Engines)
	}
	b.sequential = true
	if sc, err := b.buildScenario(); err != nil {
		t.Fatal(err)
	} else if _, ok := sc.(bench.SeedContinuation); !ok {
		t.Fatalf("--sequential: %T", sc)
	}
	b.scenario = "agentic-pressure"
	if _, err := b.buildScenario(); err == nil || !strings.Contains(err.Error(), "--sequential") {
		t.Fatalf("--sequential with agentic-pressure: %v", err)
	}
}

// TestBenchAdmission: admission control is off unless --admission, but
// for the scenarios that test it, which --admission=false turns off.
func TestBenchAdmission(t *testing.T) {
	for _, tc := range []struct {
		scenario     string
		given, value bool
		want         bool
	}{
		{"seed-continuation", false, false, false},
		{"agentic-pressure", true, true, true},
		{"overload", false, false, true},
		{"tenants", false, false, true},
		{"overload", true, false, false},
		{"shared-prefix", true, false, false},
	} {
		b := benchFlags{scenario: tc.scenario, admission: tc.value}
		if got := b.admissionOn(tc.given); got != tc.want {
			t.Errorf("%s, --admission given %v (%v): %v, want %v", tc.scenario, tc.given, tc.value, got, tc.want)
		}
	}
}

// TestBenchUsage checks the exit codes of the new flags' misuse (nothing
// runs: each fails before a fleet starts) and that --help names them.
func TestBenchUsage(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--peers", "--policies", "precise", "--out", "x"},
		{"bench", "--scenario", "shared-prefix", "--sequential", "--out", "x"},
		{"bench", "--policies", "llm-d,nope", "--out", "x"},
		{"bench", "--saturation-prefill-tokens", "4096", "--out", "x"},
		{"bench", "--scenario", "faults", "--admission", "--out", "x"},
		{"bench", "--pickers", "0", "--out", "x"},
		{"bench", "--scenario", "faults", "--pickers", "2", "--out", "x"},
	} {
		if code, _, errOut := runArgs(args...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
	code, out, _ := runArgs("bench", "--help")
	for _, want := range []string{"--peers", "--sequential", "llm-d-precise", "sglang", "best peer", "chance", "--admission", "llm-d-calibrated",
		"given tokens", "median TTFT", "--pickers", "load_cv"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("bench --help (exit %d) lacks %q", code, want)
		}
	}
}
