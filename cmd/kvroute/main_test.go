package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	if _, out, _ := runArgs("--help"); !strings.Contains(out, "Exit codes: 0") || !strings.Contains(out, "2 bad usage") {
		t.Errorf("--help does not give the exit codes:\n%s", out)
	}
	code, out, _ := runArgs("--version")
	if code != 0 || !strings.Contains(out, "kvroute-xxh3-v1") {
		t.Errorf("--version: exit %d, %q", code, out)
	}
}

// TestBinaryExitCode runs the real process, so the exit code reaches the
// shell as operators will see it: 2 for bad usage (an unknown subcommand
// or flag, a flag value or combination refused), 1 for a failure to start
// or run (a port in use, a file that cannot be read, a picker not
// reached).
func TestBinaryExitCode(t *testing.T) {
	if os.Getenv("KVROUTE_TEST_MAIN") == "1" {
		os.Args = append([]string{"kvroute"}, strings.Fields(os.Getenv("KVROUTE_TEST_ARGS"))...)
		main()
		return
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	inUse := taken.Addr().String()
	missing := filepath.Join(t.TempDir(), "missing")
	// A picker that would otherwise start binds nothing fixed: ephemeral
	// admin port, no gRPC, no gossip.
	picker := "picker --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --grpc-listen= --gossip-bind= --sidecars 127.0.0.1:1 "
	for _, tc := range []struct {
		args string
		want int
	}{
		{"--help", 0},
		// Usage: 2.
		{"nosuch", 2},
		{"picker --nosuch-flag", 2},
		{"picker --capacity lots", 2},
		{"picker --policy nope", 2},
		{picker + "--load-epsilon -1", 2},
		{"picker extra-argument", 2},
		{"engine --block-size 0", 2},
		{"verify", 2},
		{"inject", 2},
		{"inject -f - --data-parallel-size 200", 2},
		{"demo --time-scale -1", 2},
		{"bench --scenario nope", 2},
		{"bench --profile nope --out x", 2},
		{"lab --profile nope --out x", 2},
		{"bench --scenario trace --out x", 2},
		{"bench --policies precise,precise --out x", 2},
		{"bench --load-epsilon -1 --out x", 2},
		// Start and run failures: 1.
		{"picker --listen " + inUse + " --admin-listen 127.0.0.1:0 --grpc-listen= --gossip-bind= --sidecars 127.0.0.1:1", 1},
		{"picker --listen 127.0.0.1:0 --admin-listen " + inUse + " --grpc-listen= --gossip-bind= --sidecars 127.0.0.1:1", 1},
		{"engine --host 127.0.0.1 --port " + strings.TrimPrefix(inUse, "127.0.0.1:"), 1},
		{picker + "--decision-token-file " + missing, 1},
		{picker + "--config " + missing, 1},
		{"picker --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --grpc-listen= --gossip-bind 127.0.0.1:0 --gossip-key-file " + missing, 1},
		{"inject -f " + missing, 1},
		{"bench --scenario trace --trace " + missing + " --out x", 1},
		{"verify --picker http://" + inUse + " --picker-admin http://" + inUse + " --timeout 2s", 1},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBinaryExitCode$")
		cmd.Env = append(os.Environ(), "KVROUTE_TEST_MAIN=1", "KVROUTE_TEST_ARGS="+tc.args)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		timedOut := ctx.Err() != nil
		cancel()
		got := 0
		if ee, ok := err.(*exec.ExitError); ok {
			got = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if timedOut {
			t.Errorf("kvroute %s: still running after a minute (killed)", tc.args)
			continue
		}
		t.Logf("kvroute %s: %d: %s", tc.args, got, strings.TrimSpace(stderr.String()))
		if got != tc.want {
			t.Errorf("kvroute %s exited %d, want %d\n%s", tc.args, got, tc.want, stderr.String())
		}
	}
}
