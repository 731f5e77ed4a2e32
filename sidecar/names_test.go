package sidecar_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/test/testnet"
)

// TestMetricAndStateNames: the engine's load is exported as a request
// count by state and a separate KV usage ratio (never a ratio and counts
// under one name), and every key of /debug/state is snake_case.
func TestMetricAndStateNames(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	s := startSidecar(t, sidecarConfig(e))
	series := func(name string) int {
		n, err := testutil.GatherAndCount(s.Registry(), name)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := series("kvroute_sidecar_engine_requests"); n < 2 {
			return fmt.Errorf("%d engine request gauges, want 2 after the first scrape", n)
		}
		return nil
	})
	if n := series("kvroute_sidecar_engine_kv_cache_usage_ratio"); n != 1 {
		t.Fatalf("kv cache usage ratio: %d series, want 1", n)
	}
	if n := series("kvroute_sidecar_engine_load"); n != 0 {
		t.Fatalf("the old mixed engine_load gauge is still exported (%d series)", n)
	}
	var state any
	if code := getJSON(t, "http://"+s.DebugAddr()+"/debug/state", &state); code != 200 {
		t.Fatalf("/debug/state: %d", code)
	}
	var bad []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				if !snake(k) && path != "$.blocks" && path != "$.summary" && path != "$.delta_seq" { // tier names are values
					bad = append(bad, path+"."+k)
				}
				walk(path+"."+k, c)
			}
		case []any:
			for _, c := range x {
				walk(path, c)
			}
		}
	}
	walk("$", state)
	if len(bad) > 0 {
		b, _ := json.Marshal(state)
		t.Fatalf("keys not in snake_case: %v\n%s", bad, fmt.Sprintf("%.2000s", b))
	}
	if len(state.([]any)) == 0 || state.([]any)[0].(map[string]any)["index"].(map[string]any)["stored_blocks"] == nil {
		t.Fatalf("index stats lack stored_blocks: %v", state)
	}
}

func snake(k string) bool {
	for _, r := range k {
		if unicode.IsUpper(r) || r == '-' || r == ' ' {
			return false
		}
	}
	return k != ""
}
