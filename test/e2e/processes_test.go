package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// buildKvroute builds the binary once per test run.
func buildKvroute(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kvroute")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kvroute")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// run starts a kvroute process and stops it (SIGTERM, then SIGKILL) at the
// end of the test; its output is kept for failure messages.
func run(t *testing.T, bin string, args ...string) *output {
	t.Helper()
	return startProcess(t, exec.Command(bin, args...), syscall.SIGTERM, func(out string) {
		t.Logf("%s %s output:\n%s", filepath.Base(bin), args[0], out)
	})
}

// output is a process's combined output, safe to read while it runs.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// startProcess starts cmd, and at the end of the test sends it stop, then
// kills it after 10 s; on failure it hands the output to report.
func startProcess(t testing.TB, cmd *exec.Cmd, stop syscall.Signal, report func(out string)) *output {
	t.Helper()
	out := &output{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(stop)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			report(out.String())
		}
	})
	return out
}

func getJSON(url string, out any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// debugEndpoints reads a picker's /debug/endpoints (admin: its admin base
// URL) into the one wire type the picker writes it with.
func debugEndpoints(admin string) (debugapi.Document, error) {
	var d debugapi.Document
	err := getJSON(admin+debugapi.Path, &d)
	return d, err
}

// TestEngineAndSidecarProcesses runs the real binaries: `kvroute engine`
// publishing KV events and `kvroute sidecar` following them (with gossip
// on loopback, the SUB bound and the engine's PUB connecting to it), and
// checks the sidecar indexes what the engine caches.
func TestEngineAndSidecarProcesses(t *testing.T) {
	bin := buildKvroute(t)
	httpPort, events, replay := testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)
	// The engine's PUB connects (a non-wildcard endpoint, as vLLM decides)
	// to the sidecar's bound SUB: everything stays on 127.0.0.1.
	kvcfg := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:%d","replay_endpoint":"tcp://127.0.0.1:%d","topic":"kv@e2e@m"}`, events, replay)
	run(t, bin, "engine", "--host", "127.0.0.1", "--port", fmt.Sprint(httpPort), "--sim-time-scale", "0",
		"--num-gpu-blocks", "1024", "--max-model-len", "4096", "--kv-events-config", kvcfg, "--log-level", "warn")
	engine := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	debug := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	run(t, bin, "sidecar", "--engine-url", engine, "--kv-events", fmt.Sprintf("tcp://127.0.0.1:%d", events), "--kv-events-mode", "bind",
		"--replay", fmt.Sprintf("tcp://127.0.0.1:%d", replay), "--topic", "kv@e2e", "--admin-listen", debug,
		"--grpc-listen", "127.0.0.1:0", "--gossip-bind", "127.0.0.1:0", "--node-name", "e2e-sidecar",
		"--capacity", "4096", "--log-level", "warn")
	prompt := make([]int, 160)
	for i := range prompt {
		prompt[i] = 4000 + i
	}
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1})
	testnet.Await(t, 30*time.Second, 100*time.Millisecond, func() error {
		resp, err := http.Post(engine+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		var state []struct {
			Blocks   map[string]int `json:"blocks"`
			Identity struct {
				Model string `json:"model"`
			} `json:"identity"`
		}
		if err := getJSON("http://"+debug+"/debug/state", &state); err != nil {
			return err
		}
		if len(state) != 1 || state[0].Blocks["GPU"] != 10 || state[0].Identity.Model != "Qwen/Qwen3-0.6B" {
			return fmt.Errorf("the sidecar has not indexed the engine's blocks: state %+v", state)
		}
		return nil
	})
	var ready map[string]any
	if err := getJSON("http://"+debug+"/readyz", &ready); err != nil || ready["ready"] != true {
		t.Fatalf("readyz: %v %v", ready, err)
	}
	fams := metrictest.Families(t, "http://"+debug+"/metrics")
	gpu := map[string]string{"engine": engine, "tier": "GPU"}
	if n, v := metrictest.Series(fams, "kvroute_sidecar_blocks", gpu), metrictest.Sum(fams, "kvroute_sidecar_blocks", gpu); n != 1 || v != 10 {
		t.Fatalf("kvroute_sidecar_blocks%v: %d series, %v blocks; want one, 10", gpu, n, v)
	}
}

// TestPickerProcess runs the real binaries as a fleet: two engines, a
// sidecar each, and a picker, all finding one another through gossip on
// loopback; a conversation sent through the picker runs its second turn
// where its first ran, with the engine reporting the first turn cached.
// One sidecar runs with --p2p-port: the picker shows its engine's KV
// source (the engine URL's host, that port), and none for the other.
func TestPickerProcess(t *testing.T) {
	bin := buildKvroute(t)
	public, admin := startProcessFleet(t, bin, []member{{sidecar: []string{"--p2p-port", "5710"}}, {}})
	api := strings.TrimPrefix(public, "http://")
	dbg, err := debugEndpoints(admin)
	if err != nil || len(dbg.Endpoints) != 2 {
		t.Fatalf("%v %+v", err, dbg)
	}
	var sources []string
	for _, e := range dbg.Endpoints {
		sources = append(sources, e.KVSource)
	}
	if slices.Sort(sources); strings.Join(sources, ",") != ",127.0.0.1:5710" {
		t.Fatalf("KV sources on /debug/endpoints %q: want one endpoint's 127.0.0.1:5710 (--p2p-port) and none for the other", sources)
	}
	// The admin surface is on the admin port only: the public one answers
	// 404, saying where it is.
	for _, path := range []string{debugapi.Path, "/metrics", "/readyz"} {
		code, body, err := get(public + path)
		if err != nil || code != http.StatusNotFound || !strings.Contains(body, "--admin-listen") {
			t.Errorf("public %s: %d %v %s", path, code, err, body)
		}
		if code, _, err := get(admin + path); err != nil || code != http.StatusOK {
			t.Errorf("admin %s: %d %v", path, code, err)
		}
	}
	// Each sidecar's debug server is reachable at the URL shown.
	for _, e := range dbg.Endpoints {
		var state []map[string]any // one entry a rank
		if err := getJSON(e.SidecarDebug+"/debug/state", &state); err != nil || len(state) != 1 || e.TokenizerFingerprint == "" {
			t.Fatalf("sidecar debug %q: %v (fingerprint %q)", e.SidecarDebug, err, e.TokenizerFingerprint)
		}
	}
	system := strings.Repeat("You are a helpful agent with a long, fixed system prompt. ", 40)
	turn := func(msgs ...string) (string, int, int) {
		var list []map[string]string
		list = append(list, map[string]string{"role": "system", "content": system})
		for i, m := range msgs {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			list = append(list, map[string]string{"role": role, "content": m})
		}
		body, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "messages": list, "max_tokens": 8, "cache_salt": "e2e"})
		resp, err := http.Post("http://"+api+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		u, err := openai.DecodeUsage(raw)
		if resp.StatusCode != 200 || err != nil || !u.Seen {
			t.Fatalf("chat through the picker: %d %v %s", resp.StatusCode, err, raw)
		}
		return resp.Header.Get("X-Kvroute-Endpoint"), u.Prompt, u.Cached
	}
	first, _, _ := turn("Plan the migration.")
	second, prompt, cached := turn("Plan the migration.", "Step one: inventory.", "Continue.")
	if second != first || cached < prompt*8/10 {
		t.Fatalf("turn 2 on %s (turn 1 on %s), %d of %d prompt tokens cached", second, first, cached, prompt)
	}
}
