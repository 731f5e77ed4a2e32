package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		{[]string{"lab", "--hop", "-1ms", "--out", "x"}, "--hop"},
		{[]string{"lab", "--profile", "nope", "--out", "x"}, "nope"},
	} {
		code, _, errOut := runArgs(c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}
