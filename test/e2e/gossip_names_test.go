package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/testnet"
)

// startEngine runs a simulated engine publishing KV events on 127.0.0.1
// and returns the flags a sidecar needs to follow it.
func startEngine(t *testing.T, bin string) []string {
	t.Helper()
	httpPort, events, replay := testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)
	kvcfg := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:%d","replay_endpoint":"tcp://127.0.0.1:%d"}`, events, replay)
	run(t, bin, "engine", "--host", "127.0.0.1", "--port", fmt.Sprint(httpPort), "--sim-time-scale", "0",
		"--num-gpu-blocks", "1024", "--max-model-len", "4096", "--kv-events-config", kvcfg, "--log-level", "warn")
	return []string{"--engine-url", fmt.Sprintf("http://127.0.0.1:%d", httpPort), "--kv-events", fmt.Sprintf("tcp://127.0.0.1:%d", events),
		"--kv-events-mode", "bind", "--replay", fmt.Sprintf("tcp://127.0.0.1:%d", replay), "--capacity", "4096"}
}

// get returns a URL's status and body.
func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

var nodeInfo = regexp.MustCompile(`(?m)^kvroute_gossip_node_info\{addr="([^"]+)",name="([^"]+)"\} 1$`)

// gossipState is what a process's /metrics says of its gossip membership.
type gossipState struct {
	name, addr            string
	members, selfConflict float64
}

func readGossip(base string) (gossipState, error) {
	code, body, err := get(base + "/metrics")
	if err != nil || code != 200 {
		return gossipState{}, fmt.Errorf("%s/metrics: %d %v", base, code, err)
	}
	var g gossipState
	m := nodeInfo.FindStringSubmatch(body)
	if m == nil {
		return g, fmt.Errorf("%s/metrics: no kvroute_gossip_node_info", base)
	}
	g.addr, g.name = m[1], m[2]
	var ok1, ok2 bool
	g.members, ok1 = sample(body, "kvroute_gossip_members")
	g.selfConflict, ok2 = sample(body, `kvroute_gossip_name_conflict{kind="self"}`)
	if !ok1 || !ok2 {
		return g, fmt.Errorf("%s/metrics lacks the gossip gauges", base)
	}
	return g, nil
}

// sample reads the value of the exposition line starting with series.
func sample(body, series string) (float64, bool) {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// TestSameHostFleetDefaultNames runs the real binaries as a fleet sharing
// one host, with the gossip flags every process gets when none are
// tuned: one bind port (a free one here, 7946 by default), one seed, no
// --node-name. Two engines, a sidecar each and a picker: each process
// binds the next free port of the range, names itself <host>-<role>-<port>,
// and all three see one another; the picker routes to both engines.
func TestSameHostFleetDefaultNames(t *testing.T) {
	bin := buildKvroute(t)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	port := testnet.FreePortRun(t, 3)
	gossipFlags := []string{"--gossip-bind", fmt.Sprintf("127.0.0.1:%d", port), "--join", fmt.Sprintf("127.0.0.1:%d", port)}
	var bases []string
	for i := 0; i < 2; i++ {
		debug := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
		args := append([]string{"sidecar", "--admin-listen", debug, "--grpc-listen", "127.0.0.1:0", "--log-level", "warn"}, startEngine(t, bin)...)
		run(t, bin, append(args, gossipFlags...)...)
		bases = append(bases, "http://"+debug)
	}
	api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	run(t, bin, append([]string{"picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--drain-delay", "0", "--capacity", "4096", "--log-level", "warn"}, gossipFlags...)...)
	bases = append(bases, "http://"+admin)
	err = waitFor(60*time.Second, 100*time.Millisecond, func() error {
		code, body, err := get("http://" + admin + "/readyz")
		if err != nil || code != 200 {
			return fmt.Errorf("picker /readyz: %d %q %v", code, body, err)
		}
		var dbg struct {
			Endpoints []struct{} `json:"endpoints"`
		}
		if err := getJSON("http://"+admin+"/debug/endpoints", &dbg); err != nil || len(dbg.Endpoints) != 2 {
			return fmt.Errorf("picker knows %d endpoints (%v)", len(dbg.Endpoints), err)
		}
		for _, b := range bases {
			g, err := readGossip(b)
			if err != nil {
				return err
			}
			if g.members != 3 || g.selfConflict != 0 {
				return fmt.Errorf("%s (%s): %v members, name conflict %v", g.name, b, g.members, g.selfConflict)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the same-host fleet did not form: %v", err)
	}
	var got, want []string
	for i, b := range bases {
		g, err := readGossip(b)
		if err != nil {
			t.Fatal(err)
		}
		role := "sidecar"
		if i == 2 {
			role = "picker"
		}
		_, p, _ := strings.Cut(g.addr, ":")
		if g.name != host+"-"+role+"-"+p {
			t.Errorf("%s at %s: want the name %s-%s-%s", g.name, g.addr, host, role, p)
		}
		got = append(got, g.addr)
		want = append(want, fmt.Sprintf("127.0.0.1:%d", port+i))
	}
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("gossip addresses %v, want %v (one port each from the range)", got, want)
	}
}

// TestNameClashReported runs a sidecar and a picker given one --node-name.
// Each reports the conflict: /readyz fails naming it, the conflict gauge
// and counter say so, and the error line is logged once (memberlist's own
// per-message line is not at error).
func TestNameClashReported(t *testing.T) {
	bin := buildKvroute(t)
	sg, pg := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	debug := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	sidecar := exec.Command(bin, append([]string{"sidecar", "--admin-listen", debug, "--grpc-listen", "127.0.0.1:0", "--gossip-bind", sg,
		"--node-name", "twin", "--log-level", "warn"}, startEngine(t, bin)...)...)
	sout := startProcess(t, sidecar, syscall.SIGTERM, func(out string) { t.Logf("sidecar output:\n%s", out) })
	// The picker joins once the sidecar is a member (else its first join
	// fails and it tries again a rejoin interval, 10 s, later).
	if err := waitFor(30*time.Second, 50*time.Millisecond, func() error { _, err := readGossip("http://" + debug); return err }); err != nil {
		t.Fatalf("the sidecar never joined gossip: %v", err)
	}
	api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	picker := exec.Command(bin, "picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--drain-delay", "0", "--gossip-bind", pg, "--join", sg,
		"--node-name", "twin", "--capacity", "4096", "--log-level", "warn")
	pout := startProcess(t, picker, syscall.SIGTERM, func(out string) { t.Logf("picker output:\n%s", out) })
	for _, p := range []struct{ name, base, other string }{{"sidecar", "http://" + debug, pg}, {"picker", "http://" + admin, sg}} {
		err := waitFor(60*time.Second, 100*time.Millisecond, func() error {
			code, body, err := get(p.base + "/readyz")
			if err != nil {
				return err
			}
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "gossip name conflict") || !strings.Contains(body, p.other) {
				return fmt.Errorf("/readyz %d %q", code, body)
			}
			_, metrics, err := get(p.base + "/metrics")
			if err != nil {
				return err
			}
			for _, series := range []string{`kvroute_gossip_name_conflict{kind="self"}`, `kvroute_gossip_name_conflicts_total{kind="self"}`} {
				if v, ok := sample(metrics, series); !ok || v != 1 {
					return fmt.Errorf("%s = %v (present %v)", series, v, ok)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("the %s does not report the clash: %v", p.name, err)
		}
	}
	// Stop both, then read their logs: one error line each.
	for _, p := range []struct {
		name string
		cmd  *exec.Cmd
		out  interface{ String() string }
	}{{"sidecar", sidecar, sout}, {"picker", picker, pout}} {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
		var errs []string
		for _, l := range strings.Split(p.out.String(), "\n") {
			if strings.Contains(l, `"level":"error"`) {
				errs = append(errs, l)
			}
		}
		if len(errs) != 1 || !strings.Contains(errs[0], "gossip name conflict") || !strings.Contains(errs[0], `"name":"twin"`) {
			t.Errorf("%s: want one error line, the conflict's; got %d:\n%s", p.name, len(errs), strings.Join(errs, "\n"))
		}
	}
}
