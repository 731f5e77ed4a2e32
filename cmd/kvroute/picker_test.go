package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/extproc"
	"github.com/kvroute/kvroute/picker/score"
)

// TestPickerFlags: flags reach the configuration, and bad values are usage
// errors naming the flag.
func TestPickerFlags(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, cfg, finish := pickerCommand()
	if err := cmd.ParseFlags([]string{"--listen", "127.0.0.1:0", "--grpc-listen", "", "--gossip-bind", "", "--sidecars", "127.0.0.1:9090,127.0.0.1:9091",
		"--policy", "least-loaded", "--load-epsilon", "0.5", "--min-load-cap", "2", "--tokenize-timeout", "300ms", "--unresolved", "load-only",
		"--anchor-tokens", "512", "--max-body-bytes", "65536", "--capacity", "8192", "--max-group-endpoints", "2000", "--decision-token-file", token}); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	r := cfg.Router
	if r.Score.Policy != score.LeastLoaded || r.Score.Epsilon != 0.5 || r.Score.MinCap != 2 || r.TokenizeTimeout.Milliseconds() != 300 ||
		r.Unresolved != picker.UnresolvedLoadOnly || r.AnchorTokens != 512 || r.MaxBodyBytes != 65536 || cfg.Capacity != 8192 || cfg.MaxGroupEndpoints != 2000 ||
		cfg.DecisionTokenFile != token || cfg.DecisionToken != "" || cfg.Gossip != nil || len(cfg.Sidecars) != 2 || cfg.GRPCListen != "" {
		t.Fatalf("%+v", cfg)
	}
	for _, tc := range []struct{ args, want string }{
		{"--policy random", "--policy"},
		{"--unresolved maybe", "--unresolved"},
		{"--anchor-tokens 0", "--anchor-tokens"},
		{"--tokenize-timeout 0s", "--tokenize-timeout"},
		{"--gossip-bind=", "no way to find sidecars"},
		{"--decision-token-file /nonexistent", "--decision-token-file"},
		{"--gossip-bind nope", "--gossip-bind"},
		{"--gossip-bind= --sidecars 127.0.0.1:9090 --models a,,b", "--models"},
		{"--gossip-bind= --sidecars 127.0.0.1:9090 --max-group-endpoints 0", "--max-group-endpoints"},
		{"--gossip-bind= --sidecars 127.0.0.1:9090 --max-group-endpoints 16385", "--max-group-endpoints"},
		{"--policy llm-d --llmd-peak-prefill-throughput 0", "--llmd-peak-prefill-throughput 0: want a positive"},
		{"--policy llm-d --llmd-peak-prefill-throughput -5", "--llmd-peak-prefill-throughput"},
		{"--policy llm-d --llmd-max-ttft-penalty -1s", "--llmd-max-ttft-penalty -1s"},
		{"--policy dynamo --llmd-max-ttft-penalty 5s", "--llmd-max-ttft-penalty is for --policy llm-d, not dynamo"},
		{"--llmd-peak-prefill-throughput 9000", "--llmd-peak-prefill-throughput is for --policy llm-d, not precise"},
	} {
		cmd, _, finish := pickerCommand()
		if err := cmd.ParseFlags(strings.Fields(tc.args)); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.args, err)
		}
	}
}

// TestPickerLLMDGateFlags: --llmd-peak-prefill-throughput and
// --llmd-max-ttft-penalty default to llm-d's guide's values and take
// others with --policy llm-d (0 s: stickiness never breaks).
func TestPickerLLMDGateFlags(t *testing.T) {
	for _, tc := range []struct {
		args    string
		peak    float64
		penalty time.Duration
	}{
		{"--policy llm-d", 15928, 18 * time.Second},
		{"--policy llm-d --llmd-peak-prefill-throughput 9706 --llmd-max-ttft-penalty 18s", 9706, 18 * time.Second},
		{"--policy llm-d --llmd-max-ttft-penalty 0s", 15928, 0},
	} {
		cmd, _, finish := pickerCommand()
		if err := cmd.ParseFlags(append(strings.Fields(tc.args), "--gossip-bind=", "--sidecars", "127.0.0.1:9090")); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err != nil {
			t.Fatalf("%s: %v", tc.args, err)
		}
		peak, _ := cmd.Flags().GetFloat64("llmd-peak-prefill-throughput")
		penalty, _ := cmd.Flags().GetDuration("llmd-max-ttft-penalty")
		if peak != tc.peak || penalty != tc.penalty {
			t.Errorf("%s: peak %v, penalty %v; want %v, %v", tc.args, peak, penalty, tc.peak, tc.penalty)
		}
	}
}

// TestPickerModelsFlag: --models reaches the configuration (issue 21);
// by default none, every model.
func TestPickerModelsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, nil},
		{[]string{"--models", "Qwen/Qwen3-0.6B"}, []string{"Qwen/Qwen3-0.6B"}},
		{[]string{"--models", "a,b", "--models", "c"}, []string{"a", "b", "c"}},
	} {
		cmd, cfg, finish := pickerCommand()
		if err := cmd.ParseFlags(append([]string{"--sidecars", "127.0.0.1:9090", "--gossip-bind", ""}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Models, tc.want) {
			t.Errorf("%v: models %q, want %q", tc.args, cfg.Models, tc.want)
		}
	}
	// The picker.json key, flags winning.
	file := filepath.Join(t.TempDir(), "picker.json")
	if err := os.WriteFile(file, []byte(`{"models": "x,y"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"x", "y"}},
		{[]string{"--models", "z"}, []string{"z"}},
	} {
		cmd, cfg, finish := pickerCommand()
		if err := cmd.ParseFlags(append([]string{"--sidecars", "127.0.0.1:9090", "--gossip-bind", "", "--config", file}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Models, tc.want) {
			t.Errorf("config file, %v: models %q, want %q", tc.args, cfg.Models, tc.want)
		}
	}
}

// TestPickerExtProcFlags: the endpoint picker's flags reach the
// configuration; it is off by default; bad values name their flag.
func TestPickerExtProcFlags(t *testing.T) {
	cmd, cfg, finish := pickerCommand()
	if err := cmd.ParseFlags([]string{"--sidecars", "127.0.0.1:9090", "--gossip-bind", ""}); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil || cfg.ExtProcListen != "" || cfg.ExtProc.Fallbacks != 2 || cfg.ExtProc.ShedWaiting != 0 ||
		cfg.ExtProc.Assume != extproc.FullDuplex {
		t.Fatalf("defaults: %+v %v", cfg.ExtProc, err)
	}
	cmd, cfg, finish = pickerCommand()
	if err := cmd.ParseFlags([]string{"--sidecars", "127.0.0.1:9090", "--gossip-bind", "", "--ext-proc-listen", "127.0.0.1:9002",
		"--ext-proc-tls-cert", "c.pem", "--ext-proc-tls-key", "k.pem", "--ext-proc-fallbacks", "3", "--ext-proc-shed-waiting", "4",
		"--ext-proc-body-timeout", "5s", "--ext-proc-assume-body-mode", "buffered"}); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	e := cfg.ExtProc
	if cfg.ExtProcListen != "127.0.0.1:9002" || cfg.ExtProcTLSCert != "c.pem" || cfg.ExtProcTLSKey != "k.pem" || e.Fallbacks != 3 ||
		e.ShedWaiting != 4 || e.BodyTimeout.Seconds() != 5 || e.Assume != extproc.Buffered {
		t.Fatalf("%+v", cfg)
	}
	for _, tc := range []struct{ args, want string }{
		{"--ext-proc-fallbacks 9", "--ext-proc-fallbacks"},
		{"--ext-proc-shed-waiting -1", "--ext-proc-shed-waiting"},
		{"--ext-proc-body-timeout 0s", "--ext-proc-body-timeout"},
		{"--ext-proc-assume-body-mode grpc", "--ext-proc-assume-body-mode"},
		{"--ext-proc-listen :0 --ext-proc-tls-cert c.pem", "give both or neither"},
		{"--ext-proc-tls-cert c.pem --ext-proc-tls-key k.pem", "without --ext-proc-listen"},
	} {
		cmd, _, finish := pickerCommand()
		if err := cmd.ParseFlags(append([]string{"--sidecars", "127.0.0.1:9090", "--gossip-bind", ""}, strings.Fields(tc.args)...)); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.args, err)
		}
	}
}

// TestBenchProgress: plain lines when not on a terminal, one redrawn line
// on one.
func TestBenchProgress(t *testing.T) {
	var plain, tty strings.Builder
	p, q := progress(&plain, false), progress(&tty, true)
	for i := 1; i <= 54; i++ {
		p("precise", i)
		q("precise", i)
	}
	p("precise", -1)
	q("precise", -1)
	if plain.String() != "precise: 25 requests\nprecise: 50 requests\nprecise: 54 requests, done\n" {
		t.Fatalf("plain: %q", plain.String())
	}
	if strings.Count(tty.String(), "\n") != 1 || !strings.HasSuffix(tty.String(), "54 requests, done\n") {
		t.Fatalf("tty: %q", tty.String())
	}
}
