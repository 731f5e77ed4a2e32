package verify

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/debugapi"
)

func healthy(i int, model string) debugapi.Endpoint {
	return debugapi.Endpoint{Endpoint: fmt.Sprintf("http://10.0.0.%d:8000", i), Sidecar: fmt.Sprintf("10.0.0.%d:9090", i), Model: model,
		BlockSize: 16, NumGPUBlocks: 4096, HashAlgo: "sha256_cbor", KeyFormat: "kvroute-xxh3-v1", SummaryParams: "m=65536",
		TokenizerFingerprint: "tok-a", StaleSecs: 0.2, State: "cached"}
}

// failures is "endpoint check" for each failed check, sorted as returned.
func failures(checks []Check) []string {
	var out []string
	for _, c := range Failed(checks) {
		out = append(out, c.Endpoint+" "+c.Name)
	}
	return out
}

func TestConsistency(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  func() []debugapi.Endpoint
		want []string // failed checks
	}{
		{"healthy fleet of two models", func() []debugapi.Endpoint {
			return []debugapi.Endpoint{healthy(1, "a"), healthy(2, "a"), healthy(3, "a"), healthy(4, "b")}
		}, nil},
		{"one block size differs", func() []debugapi.Endpoint {
			e := []debugapi.Endpoint{healthy(1, "a"), healthy(2, "a"), healthy(3, "a")}
			e[1].BlockSize = 32
			return e
		}, []string{"http://10.0.0.2:8000 identity block_size"}},
		{"another tokenizer and summary size", func() []debugapi.Endpoint {
			e := []debugapi.Endpoint{healthy(1, "a"), healthy(2, "a"), healthy(3, "a")}
			e[2].TokenizerFingerprint, e[2].SummaryParams = "tok-b", "m=32768"
			return e
		}, []string{"http://10.0.0.3:8000 identity summary_params", "http://10.0.0.3:8000 identity tokenizer_fingerprint"}},
		{"a tie fails both sides", func() []debugapi.Endpoint {
			e := []debugapi.Endpoint{healthy(1, "a"), healthy(2, "a")}
			e[1].HashAlgo = "sha256"
			return e
		}, []string{"http://10.0.0.1:8000 identity hash_algo", "http://10.0.0.2:8000 identity hash_algo"}},
		{"models are compared apart", func() []debugapi.Endpoint {
			e := []debugapi.Endpoint{healthy(1, "a"), healthy(2, "b")}
			e[1].BlockSize = 64
			return e
		}, nil},
		{"stale and partial sidecars", func() []debugapi.Endpoint {
			e := []debugapi.Endpoint{healthy(1, "a"), healthy(2, "a"), healthy(3, "a")}
			e[0].StaleSecs, e[2].Partial = 12, true
			return e
		}, []string{"http://10.0.0.1:8000 sidecar fresh", "http://10.0.0.3:8000 sidecar fresh"}},
		{"a sidecar that never sent anything", func() []debugapi.Endpoint {
			e := []debugapi.Endpoint{healthy(1, "a"), healthy(2, "a")}
			e[1].StaleSecs, e[1].NeverUpdated = 0, true
			return e
		}, []string{"http://10.0.0.2:8000 sidecar fresh"}},
		{"draining, down and load-only endpoints on the picker", func() []debugapi.Endpoint {
			e := []debugapi.Endpoint{healthy(1, "a"), healthy(2, "a"), healthy(3, "a"), healthy(4, "a"), healthy(5, "a")}
			e[1].State, e[1].StateReason = "draining", "the sidecar announced a drain (shutting down)"
			e[2].State, e[2].StateReason = "down", "ejected by the picker after a failure reaching the engine: connection refused"
			e[3].State, e[3].StateReason = "load_only", "the KV event stream is silent: use --kv-events-mode bind"
			e[4].State, e[4].StateReason = "", "" // a picker that reports no state
			return e
		}, []string{"http://10.0.0.2:8000 picker state", "http://10.0.0.3:8000 picker state", "http://10.0.0.4:8000 picker state"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, checks := Consistency(tc.eps(), DefaultMaxStale)
			if got := failures(checks); strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("failed %q, want %q", got, tc.want)
			}
			for _, c := range Failed(checks) {
				if c.Cause == "" || c.Detail == "" {
					t.Errorf("%+v: a failure needs its numbers and a likely cause", c)
				}
			}
			if n := len(checks); n != len(tc.eps())*(len(fields)+2) {
				t.Fatalf("%d checks", n)
			}
		})
	}
}

func TestGroups(t *testing.T) {
	e := []debugapi.Endpoint{healthy(2, "a"), healthy(1, "a"), healthy(3, "a"), healthy(4, "b")}
	e[2].BlockSize = 32
	groups, checks := Consistency(e, DefaultMaxStale)
	if len(groups) != 2 || groups[0].Model != "a" || strings.Join(groups[0].Endpoints, ",") != "http://10.0.0.1:8000,http://10.0.0.2:8000,http://10.0.0.3:8000" {
		t.Fatalf("groups %+v", groups)
	}
	if groups[0].Values["block_size"] != "16" || groups[0].Values["tokenizer_fingerprint"] != "tok-a" {
		t.Fatalf("majority values %v", groups[0].Values)
	}
	c := Failed(checks)[0]
	if !strings.Contains(c.Detail, `block_size "32", a's majority has "16"`) || !strings.Contains(c.Cause, "--block-size") {
		t.Fatalf("%+v", c)
	}
	if s := Summary(checks); s != "28 checks, 27 passed, 1 failed" {
		t.Fatal(s)
	}
}

func TestRefused(t *testing.T) {
	for _, reason := range []string{"summary_params", "group_full", "other_owner", "new"} {
		c := Refused("http://e", reason, "m=1")
		if c.OK || c.Endpoint != "http://e" || !strings.Contains(c.Detail, reason) || c.Cause == "" {
			t.Fatalf("%s: %+v", reason, c)
		}
	}
}

// TestJudgeKVSources: per model, how many endpoints advertise a KV
// source; informational, so it passes with none, some or all.
func TestJudgeKVSources(t *testing.T) {
	e := []debugapi.Endpoint{healthy(1, "b"), healthy(2, "a"), healthy(3, "a"), healthy(4, "c")}
	e[1].KVSource, e[3].KVSource = "10.0.0.2:5710", "10.0.0.4:5710"
	checks := JudgeKVSources(e)
	var got []string
	for _, c := range checks {
		if !c.OK || c.Name != "kv sources" || c.Detail == "" {
			t.Errorf("%+v", c)
		}
		got = append(got, c.Endpoint+" "+c.Figure)
	}
	if strings.Join(got, ",") != "a 1/2,b 0/1,c 1/1" {
		t.Fatalf("%q", got)
	}
	if !strings.Contains(checks[1].Detail, "--p2p-port") {
		t.Fatalf("no source, no hint: %q", checks[1].Detail)
	}
	if len(JudgeKVSources(nil)) != 0 {
		t.Fatal("checks for no fleet")
	}
}
