package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

var subcommands = []string{"engine", "sidecar", "picker", "bench", "lab", "demo", "inject", "verify"}

func runArgs(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestHelp(t *testing.T) {
	code, out, _ := runArgs("--help")
	if code != 0 {
		t.Fatalf("--help exited %d", code)
	}
	for _, sub := range subcommands {
		if !strings.Contains(out, "\n  "+sub+" ") {
			t.Errorf("--help does not list %s:\n%s", sub, out)
		}
	}
	for _, sub := range subcommands {
		code, out, _ := runArgs(sub, "--help")
		if code != 0 || !strings.Contains(out, "kvroute "+sub) {
			t.Errorf("%s --help: exit %d\n%s", sub, code, out)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"nosuch"}, {"--nosuch-flag"}} {
		if code, _, errOut := runArgs(args...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
	code, out, _ := runArgs("--version")
	if code != 0 || !strings.Contains(out, "kvroute-xxh3-v1") {
		t.Errorf("--version: exit %d, %q", code, out)
	}
}

// TestBinaryExitCode runs the real process, so the exit code reaches the
// shell as operators will see it.
func TestBinaryExitCode(t *testing.T) {
	if os.Getenv("KVROUTE_TEST_MAIN") == "1" {
		os.Args = append([]string{"kvroute"}, strings.Fields(os.Getenv("KVROUTE_TEST_ARGS"))...)
		main()
		return
	}
	for args, want := range map[string]int{"verify": 2, "verify --picker http://127.0.0.1:1": 2, "inject": 2, "inject -f /nonexistent": 1, "inject -f - --data-parallel-size 200": 2, "demo --time-scale -1": 2, "bench --scenario nope": 2, "bench --profile nope --out x": 2, "lab --profile nope --out x": 2, "bench --scenario trace --out x": 2, "bench --policies precise,precise --out x": 2, "bench --load-epsilon -1 --out x": 2, "bench --scenario trace --trace /nonexistent --out x": 2, "--help": 0, "nosuch": 2, "engine --block-size 0": 2, "picker --policy nope": 2} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestBinaryExitCode$")
		cmd.Env = append(os.Environ(), "KVROUTE_TEST_MAIN=1", "KVROUTE_TEST_ARGS="+args)
		err := cmd.Run()
		got := 0
		if ee, ok := err.(*exec.ExitError); ok {
			got = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("kvroute %s exited %d, want %d", args, got, want)
		}
	}
}
