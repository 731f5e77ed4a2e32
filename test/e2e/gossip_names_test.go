package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/test/metrictest"
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

// gossipState is what a process's /metrics says of its gossip membership.
type gossipState struct {
	name, addr            string
	members, selfConflict float64
}

func readGossip(base string) (gossipState, error) {
	fams, err := metrictest.Fetch(base + "/metrics")
	if err != nil {
		return gossipState{}, err
	}
	var g gossipState
	if !nodeInfo(fams, &g) {
		return g, fmt.Errorf("%s/metrics: no kvroute_gossip_node_info", base)
	}
	var ok1, ok2 bool
	g.members, ok1 = sample(fams, "kvroute_gossip_members", nil)
	g.selfConflict, ok2 = sample(fams, "kvroute_gossip_name_conflict", map[string]string{"kind": "self"})
	if !ok1 || !ok2 {
		return g, fmt.Errorf("%s/metrics lacks the gossip gauges", base)
	}
	return g, nil
}

// nodeInfo reads the name and address of kvroute_gossip_node_info's one
// series, at 1, into g.
func nodeInfo(fams []*dto.MetricFamily, g *gossipState) bool {
	if n := metrictest.Series(fams, "kvroute_gossip_node_info", nil); n != 1 || metrictest.Sum(fams, "kvroute_gossip_node_info", nil) != 1 {
		return false
	}
	addr := metrictest.LabelValues(fams, "kvroute_gossip_node_info", "addr", nil)
	name := metrictest.LabelValues(fams, "kvroute_gossip_node_info", "name", nil)
	if len(addr) != 1 || len(name) != 1 {
		return false
	}
	g.addr, g.name = addr[0], name[0]
	return true
}

// sample reads the one series of family name whose labels include labels
// (nil: the family's only series); ok is false when there is not exactly
// one.
func sample(fams []*dto.MetricFamily, name string, labels map[string]string) (v float64, ok bool) {
	if metrictest.Series(fams, name, labels) != 1 {
		return 0, false
	}
	return metrictest.Sum(fams, name, labels), true
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
	testnet.Await(t, 60*time.Second, 100*time.Millisecond, func() error {
		code, body, err := get("http://" + admin + "/readyz")
		if err != nil || code != 200 {
			return fmt.Errorf("picker /readyz: %d %q %v", code, body, err)
		}
		if dbg, err := debugEndpoints("http://" + admin); err != nil || len(dbg.Endpoints) != 2 {
			return fmt.Errorf("picker knows %d endpoints (%v)", len(dbg.Endpoints), err)
		}
		for _, b := range bases {
			g, err := readGossip(b)
			if err != nil {
				return err
			}
			if g.members != 3 || g.selfConflict != 0 {
				return fmt.Errorf("the same-host fleet has not formed: %s (%s): %v members, name conflict %v", g.name, b, g.members, g.selfConflict)
			}
		}
		return nil
	})
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
	testnet.Await(t, 30*time.Second, 50*time.Millisecond, func() error {
		if _, err := readGossip("http://" + debug); err != nil {
			return fmt.Errorf("the sidecar has not joined gossip: %w", err)
		}
		return nil
	})
	api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	picker := exec.Command(bin, "picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--drain-delay", "0", "--gossip-bind", pg, "--join", sg,
		"--node-name", "twin", "--capacity", "4096", "--log-level", "warn")
	pout := startProcess(t, picker, syscall.SIGTERM, func(out string) { t.Logf("picker output:\n%s", out) })
	for _, p := range []struct{ name, base, other string }{{"sidecar", "http://" + debug, pg}, {"picker", "http://" + admin, sg}} {
		testnet.Await(t, 60*time.Second, 100*time.Millisecond, func() error {
			code, body, err := get(p.base + "/readyz")
			if err != nil {
				return err
			}
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "gossip name conflict") || !strings.Contains(body, p.other) {
				return fmt.Errorf("the %s does not report the clash: /readyz %d %q", p.name, code, body)
			}
			fams, err := metrictest.Fetch(p.base + "/metrics")
			if err != nil {
				return err
			}
			for _, name := range []string{"kvroute_gossip_name_conflict", "kvroute_gossip_name_conflicts_total"} {
				if v, ok := sample(fams, name, map[string]string{"kind": "self"}); !ok || v != 1 {
					return fmt.Errorf("the %s does not report the clash: %s{kind=\"self\"} = %v (present %v)", p.name, name, v, ok)
				}
			}
			return nil
		})
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
