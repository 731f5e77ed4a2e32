package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/test/lab"
	"github.com/kvroute/kvroute/test/workload"
)

// TestLabCommand: a short sweep writes results.json, summary.txt and
// report.html, and a second run of the same flags writes the same
// results.json, byte for byte.
func TestLabCommand(t *testing.T) {
	var got [][]byte
	for i := 0; i < 2; i++ {
		dir := t.TempDir()
		code, out, errOut := runArgs("lab", "--scenario", "demo", "--policies", "precise,dynamo", "--seeds", "1-2", "--rates", "1,2", "--out", dir)
		if code != 0 {
			t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
		}
		if !strings.Contains(out, "÷ the best peer") || !strings.Contains(out, "goodput") {
			t.Errorf("the table lacks the comparison or goodput:\n%s", out)
		}
		for _, f := range []string{"summary.txt", "report.html"} {
			if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
				t.Errorf("%s: %v", f, err)
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, "results.json"))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b)
	}
	if !bytes.Equal(got[0], got[1]) {
		t.Error("two runs of the same flags wrote different results.json")
	}
}

// TestLabUsageErrors: bad flags are usage errors (exit 2) that say what
// is wrong.
func TestLabUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"lab"}, "--out DIR is required"},
		{[]string{"lab", "--scenario", "nope", "--out", "x"}, `scenario "nope"`},
		{[]string{"lab", "--policies", "precise,nope", "--out", "x"}, "nope"},
		{[]string{"lab", "--seeds", "9-3", "--out", "x"}, "--seeds"},
		{[]string{"lab", "--rates", "0", "--out", "x"}, "--rates"},
		{[]string{"lab", "--pickers", "0", "--out", "x"}, "--pickers"},
		{[]string{"lab", "--pickers", "2,4", "--out", "x"}, "list 1 too"},
		{[]string{"lab", "--pickers", "1,2,2", "--out", "x"}, "2 twice"},
		{[]string{"lab", "--pickers", "1,x", "--out", "x"}, "--pickers"},
		{[]string{"lab", "--hop", "-1ms", "--out", "x"}, "--hop"},
		{[]string{"lab", "--profile", "nope", "--out", "x"}, "nope"},
	} {
		code, _, errOut := runArgs(c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

// TestLabOnePickerCount: --pickers N alone is the sweep at N pickers as
// the lab runs it (lab.RunSweep), results.json and summary.txt byte for
// byte, with no comparison by pickers.
func TestLabOnePickerCount(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runArgs("lab", "--scenario", "demo", "--policies", "precise", "--seeds", "1", "--pickers", "2", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	sc, err := workload.Named("demo", workload.NamedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := lab.DefaultConfig()
	cfg.Pickers = 2
	want, err := lab.RunSweep(lab.Sweep{Scenario: sc, Policies: []string{"precise"}, Seeds: []uint64{1}, Rates: []float64{1}, Fleet: cfg})
	if err != nil {
		t.Fatal(err)
	}
	wantJSON, err := lab.Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if !bytes.Equal(got, wantJSON) || bytes.Contains(got, []byte("by_pickers")) {
		t.Error("--pickers 2 wrote another results.json than the sweep at 2 pickers")
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "summary.txt")); string(got) != lab.Table(want) {
		t.Error("--pickers 2 wrote another summary.txt than the sweep at 2 pickers")
	}
}

// TestLabPickerCounts: --pickers 1,2 writes the comparison by pickers in
// results.json (by_pickers), summary.txt and report.html.
func TestLabPickerCounts(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runArgs("lab", "--scenario", "demo", "--policies", "precise,sglang", "--seeds", "1-2", "--pickers", "1,2", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	var res struct {
		Pickers   int `json:"pickers"`
		ByPickers struct {
			Counts []int `json:"counts"`
			Rows   []struct {
				Policy   string `json:"policy"`
				Pickers  int    `json:"pickers"`
				HitRatio *struct {
					PerSeed []*float64 `json:"per_seed"`
				} `json:"hit_rate_ratio"`
			} `json:"rows"`
			Sweeps []struct {
				Pickers int `json:"pickers"`
			} `json:"sweeps"`
		} `json:"by_pickers"`
	}
	b, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	bp := res.ByPickers
	if res.Pickers != 1 || len(bp.Counts) != 2 || len(bp.Rows) != 4 || len(bp.Sweeps) != 1 || bp.Sweeps[0].Pickers != 2 {
		t.Fatalf("results.json: %+v", res)
	}
	for _, r := range bp.Rows {
		if (r.Pickers == 2) != (r.HitRatio != nil) || r.HitRatio != nil && (len(r.HitRatio.PerSeed) != 2 || r.HitRatio.PerSeed[0] == nil) {
			t.Errorf("row %+v", r)
		}
	}
	if s, _ := os.ReadFile(filepath.Join(dir, "summary.txt")); !strings.Contains(string(s), "by pickers: the sweep at 1, 2 pickers") {
		t.Errorf("summary.txt lacks the comparison:\n%s", s)
	}
	if h, _ := os.ReadFile(filepath.Join(dir, "report.html")); !strings.Contains(string(h), "By pickers") {
		t.Error("report.html lacks the comparison")
	}
	if !strings.Contains(out, "× 2 counts of pickers (1,2)") {
		t.Errorf("stdout: %s", out)
	}
}
