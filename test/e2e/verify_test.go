package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/testnet"
)

// member is one engine of a process fleet and the extra flags it and its
// sidecar run with.
type member struct {
	engine, sidecar []string
	noDetails       bool // start the engine without --enable-prompt-tokens-details
}

// startProcessFleet runs an engine and a sidecar per member and a picker,
// all real processes finding one another through gossip on loopback, and
// returns the picker's public and admin URLs once it knows every
// endpoint.
func startProcessFleet(t *testing.T, bin string, members []member) (string, string) {
	t.Helper()
	seed := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	for i, m := range members {
		httpPort, events, replay := testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)
		kvcfg := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:%d","replay_endpoint":"tcp://127.0.0.1:%d"}`, events, replay)
		eargs := []string{"engine", "--host", "127.0.0.1", "--port", fmt.Sprint(httpPort), "--sim-time-scale", "0",
			"--num-gpu-blocks", "1024", "--max-model-len", "8192", "--kv-events-config", kvcfg, "--log-level", "warn"}
		if !m.noDetails {
			eargs = append(eargs, "--enable-prompt-tokens-details")
		}
		run(t, bin, append(eargs, m.engine...)...)
		gossipBind, join := "127.0.0.1:0", seed
		if i == 0 {
			gossipBind, join = seed, ""
		}
		args := []string{"sidecar", "--engine-url", fmt.Sprintf("http://127.0.0.1:%d", httpPort), "--kv-events", fmt.Sprintf("tcp://127.0.0.1:%d", events),
			"--kv-events-mode", "bind", "--replay", fmt.Sprintf("tcp://127.0.0.1:%d", replay), "--admin-listen", "127.0.0.1:0",
			"--grpc-listen", "127.0.0.1:0", "--gossip-bind", gossipBind, "--node-name", fmt.Sprint("sidecar-", i), "--capacity", "4096", "--log-level", "warn"}
		if join != "" {
			args = append(args, "--join", join)
		}
		run(t, bin, append(args, m.sidecar...)...)
	}
	api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	run(t, bin, "picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--drain-delay", "0", "--gossip-bind", "127.0.0.1:0", "--join", seed,
		"--node-name", "picker-0", "--capacity", "4096", "--log-level", "warn")
	testnet.Await(t, 30*time.Second, 100*time.Millisecond, func() error {
		dbg, err := debugEndpoints("http://" + admin)
		if err != nil {
			return err
		}
		if len(dbg.Endpoints) != len(members) {
			return fmt.Errorf("the picker found %d endpoints of %d", len(dbg.Endpoints), len(members))
		}
		return nil
	})
	return "http://" + api, "http://" + admin
}

// verifyResult is `kvroute verify --json`'s output and exit code.
type verifyResult struct {
	code   int
	OK     bool `json:"ok"`
	Checks []struct {
		Name     string `json:"name"`
		Endpoint string `json:"endpoint"`
		OK       bool   `json:"ok"`
		Detail   string `json:"detail"`
		Cause    string `json:"cause"`
		Figure   string `json:"figure"`
	} `json:"checks"`
	Lags []struct {
		Endpoint  string  `json:"endpoint"`
		Predicted bool    `json:"predicted"`
		LagSecs   float64 `json:"lag_seconds"`
		Polls     int     `json:"polls"`
	} `json:"lag_probes"`
	Fleet []struct {
		Endpoint  string `json:"endpoint"`
		BlockSize int    `json:"block_size"`
	} `json:"endpoints"`
	raw string
}

// failed lists "name endpoint" of the failed checks.
func (r verifyResult) failed() []string {
	var out []string
	for _, c := range r.Checks {
		if !c.OK {
			out = append(out, c.Name+" "+c.Endpoint)
		}
	}
	return out
}

func runVerify(t *testing.T, bin string, args ...string) verifyResult {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"verify", "--timeout", "10s"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := verifyResult{raw: stdout.String() + stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	// verify that could not run (exit 1, as a failed check) or was
	// misused (exit 2) prints no report.
	if strings.Contains(strings.Join(args, " "), "--json") && stdout.Len() > 0 {
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("verify --json: %v\n%s", err, r.raw)
		}
	}
	return r
}

// TestVerifyHealthyFleet: every check but the sidecar streams' passes
// (TestVerifyHealthyFleetPasses has those), the lag probe measures every
// endpoint within --max-lag and prints the figure, the human report has a
// line per check, and verify that cannot run exits 1 without a report,
// misused 2.
func TestVerifyHealthyFleet(t *testing.T) {
	bin := buildKvroute(t)
	picker, pickerAdmin := startProcessFleet(t, bin, []member{{}, {}})
	r := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin, "--json")
	if r.code == 2 || len(r.Checks) < 20 {
		t.Fatalf("exit %d, %d checks\n%s", r.code, len(r.Checks), r.raw)
	}
	for _, c := range r.Checks {
		if !c.OK && c.Name != "sidecar stream" {
			t.Errorf("failed: %+v", c)
		}
	}
	lagChecks := 0
	for _, c := range r.Checks {
		if c.Name == "probe lag" {
			lagChecks++
			if !c.OK || c.Figure == "" || !strings.Contains(c.Detail, c.Figure+" after the engine answered") {
				t.Errorf("lag check %+v", c)
			}
		}
	}
	if lagChecks != len(r.Fleet) || len(r.Lags) != len(r.Fleet) {
		t.Fatalf("%d lag checks, %d lag probes for %d endpoints\n%s", lagChecks, len(r.Lags), len(r.Fleet), r.raw)
	}
	for _, l := range r.Lags {
		if !l.Predicted || l.LagSecs <= 0 || l.LagSecs > 1 || l.Polls == 0 {
			t.Errorf("lag probe %+v", l)
		}
		t.Logf("lag probe of %s: %.1f ms (%d decisions)", l.Endpoint, l.LagSecs*1000, l.Polls)
	}
	human := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin)
	if human.code == 2 || !strings.Contains(human.raw, "✔ probe responses prediction") || !strings.Contains(human.raw, "✔ probe lag") ||
		!strings.Contains(human.raw, " ms\n") {
		t.Fatalf("exit %d\n%s", human.code, human.raw)
	}
	// verify itself cannot run: exit 1, no report.
	if r := runVerify(t, bin, "--picker", "http://127.0.0.1:1", "--json"); r.code != 1 || len(r.Checks) != 0 {
		t.Fatalf("unreachable picker: exit %d\n%s", r.code, r.raw)
	}
	// The admin port mistaken for the public one: the picker's 404 and
	// verify both say where to look.
	if r := runVerify(t, bin, "--picker", picker, "--picker-admin", picker); r.code != 1 || !strings.Contains(r.raw, "status 404") ||
		!strings.Contains(r.raw, "--picker-admin") {
		t.Fatalf("the public port as --picker-admin: exit %d\n%s", r.code, r.raw)
	}
	if r := runVerify(t, bin); r.code != 2 || !strings.Contains(r.raw, "--picker") {
		t.Fatalf("no --picker: exit %d\n%s", r.code, r.raw)
	}
	if r := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin, "--model", "no/such-model"); r.code != 1 || !strings.Contains(r.raw, "no/such-model") {
		t.Fatalf("unknown model: exit %d\n%s", r.code, r.raw)
	}
	if r := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin, "--max-lag", "0s"); r.code != 2 || !strings.Contains(r.raw, "--max-lag") {
		t.Fatalf("--max-lag 0s: exit %d\n%s", r.code, r.raw)
	}
}

// TestVerifyHealthyFleetPasses: on a healthy fleet (its sidecars bind, as
// engines whose event endpoint names a host connect) every check passes,
// the sidecar streams' included, and verify exits 0. It needs sidecars
// that report their stream state (issue 15): older ones fail it.
func TestVerifyHealthyFleetPasses(t *testing.T) {
	bin := buildKvroute(t)
	picker, pickerAdmin := startProcessFleet(t, bin, []member{{}, {}})
	r := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin, "--json")
	if r.code != 0 || !r.OK || len(r.failed()) != 0 {
		t.Fatalf("exit %d, failed %v\n%s", r.code, r.failed(), r.raw)
	}
	streams := 0
	for _, c := range r.Checks {
		if c.Name == "sidecar stream" && c.OK {
			streams++
		}
	}
	if streams != len(r.Fleet) {
		t.Fatalf("%d live streams for %d endpoints\n%s", streams, len(r.Fleet), r.raw)
	}
	human := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin)
	if human.code != 0 || !strings.Contains(human.raw, "✔ sidecar stream") || !strings.Contains(human.raw, "✔ probe lag") || strings.Contains(human.raw, "✘") {
		t.Fatalf("exit %d\n%s", human.code, human.raw)
	}
}

// TestVerifyConnectMismatch: an engine whose event endpoint names a
// concrete host connects, and its sidecar, in its default connect mode,
// connects too — no live event ever flows. verify exits 1, failing that
// endpoint's sidecar stream with the sidecar's hint (--kv-events-mode
// bind). It needs the sidecar's stream state (issue 15).
func TestVerifyConnectMismatch(t *testing.T) {
	bin := buildKvroute(t)
	picker, pickerAdmin := startProcessFleet(t, bin, []member{{sidecar: []string{"--kv-events-mode", "connect"}}})
	r := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin, "--json")
	if r.code != 1 || len(r.Fleet) != 1 {
		t.Fatalf("exit %d\n%s", r.code, r.raw)
	}
	ep := r.Fleet[0].Endpoint
	found := false
	for _, c := range r.Checks {
		if c.Name == "sidecar stream" {
			found = c.Endpoint == ep && !c.OK && strings.Contains(c.Cause, "--kv-events-mode bind")
		}
	}
	if !found {
		t.Fatalf("no sidecar stream failure on %s with the bind hint: %v\n%s", ep, r.failed(), r.raw)
	}
	human := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin)
	if human.code != 1 || !strings.Contains(human.raw, "✘ sidecar stream                           "+ep) ||
		!strings.Contains(human.raw, "--kv-events-mode bind") {
		t.Fatalf("exit %d\n%s", human.code, human.raw)
	}
}

// TestVerifyBlockSizeMismatch: one engine of three runs another block
// size; verify fails on that endpoint's block_size, and only there.
func TestVerifyBlockSizeMismatch(t *testing.T) {
	bin := buildKvroute(t)
	picker, pickerAdmin := startProcessFleet(t, bin, []member{{}, {engine: []string{"--block-size", "32"}}, {}})
	r := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin, "--json")
	var odd string
	for _, e := range r.Fleet {
		if e.BlockSize == 32 {
			odd = e.Endpoint
		}
	}
	if r.code != 1 || r.OK || odd == "" {
		t.Fatalf("exit %d, odd endpoint %q\n%s", r.code, odd, r.raw)
	}
	found := false
	for _, f := range r.failed() {
		if strings.HasPrefix(f, "identity ") && !strings.HasSuffix(f, odd) {
			t.Errorf("an identity failure on a healthy endpoint: %s", f)
		}
		if strings.Contains(f, " tokens ") {
			t.Errorf("the tokens agree, only the block size differs: %s", f)
		}
		found = found || f == "identity block_size "+odd
	}
	if !found {
		t.Fatalf("no block_size failure on %s: %v", odd, r.failed())
	}
}

// TestVerifyLostEvents: an engine whose KV events never reach its sidecar
// (dropped live, no replay) serves the probes' repeats from its cache while
// the picker predicts nothing: verify fails on the prediction.
func TestVerifyLostEvents(t *testing.T) {
	bin := buildKvroute(t)
	picker, pickerAdmin := startProcessFleet(t, bin, []member{{engine: []string{"--sim-drop-events-pct", "100"}, sidecar: []string{"--replay", ""}}})
	r := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin, "--json")
	if r.code != 1 {
		t.Fatalf("exit %d\n%s", r.code, r.raw)
	}
	prediction := false
	for _, f := range r.failed() {
		prediction = prediction || strings.HasPrefix(f, "probe completion prediction")
	}
	if !prediction {
		t.Fatalf("no prediction failure: %v\n%s", r.failed(), r.raw)
	}
}

// TestVerifyTemplateMismatch: one engine of three runs another chat
// template (a simulator switch). Its tokenizer fingerprint differs, so the
// picker keeps it in an identity group of its own and routes the model to
// the other two; verify fails it on the fingerprint and on the chat and
// Responses token parity — and nowhere else (the lag probe leaves it out:
// nothing is routed there).
func TestVerifyTemplateMismatch(t *testing.T) {
	bin := buildKvroute(t)
	picker, pickerAdmin := startProcessFleet(t, bin, []member{{}, {engine: []string{"--sim-chat-template", "alt"}}, {}})
	r := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin, "--json")
	if r.code != 1 {
		t.Fatalf("exit %d\n%s", r.code, r.raw)
	}
	var odd string
	for _, f := range r.failed() {
		if name, ep, ok := strings.Cut(f, " http"); ok && name == "identity tokenizer_fingerprint" {
			odd = "http" + ep
		}
	}
	if odd == "" {
		t.Fatalf("no fingerprint failure: %v", r.failed())
	}
	want := map[string]bool{"identity tokenizer_fingerprint " + odd: true, "probe chat tokens " + odd: true, "probe responses tokens " + odd: true}
	for _, f := range r.failed() {
		if strings.HasPrefix(f, "sidecar stream ") {
			continue // the stream is the healthy tests' (TestVerifyHealthyFleetPasses)
		}
		if !want[f] {
			t.Errorf("unexpected failure %s", f)
		}
		delete(want, f)
	}
	if len(want) > 0 {
		t.Fatalf("missing failures %v (failed: %v)", want, r.failed())
	}
}

// TestVerifyNoCachedDetails: an engine started without
// --enable-prompt-tokens-details is flagged: no outcome can be measured.
func TestVerifyNoCachedDetails(t *testing.T) {
	bin := buildKvroute(t)
	picker, pickerAdmin := startProcessFleet(t, bin, []member{{noDetails: true}})
	r := runVerify(t, bin, "--picker", picker, "--picker-admin", pickerAdmin, "--json")
	found := false
	for _, c := range r.Checks {
		if c.Name == "engine reports cached tokens" {
			found = !c.OK && strings.Contains(c.Cause, "--enable-prompt-tokens-details")
		}
	}
	if r.code != 1 || !found {
		t.Fatalf("exit %d, failed %v\n%s", r.code, r.failed(), r.raw)
	}
}
