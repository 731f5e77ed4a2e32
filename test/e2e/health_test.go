package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// healthFleet is a process fleet whose engines and sidecars can be
// signalled: n engines, a sidecar each (bound SUB, the engine connecting:
// the matching modes), and a picker, found through gossip on loopback.
type healthFleet struct {
	picker   string // http://host:port
	admin    string // the picker's admin surface, http://host:port
	pickerP  *exec.Cmd
	engines  []*exec.Cmd
	sidecars []*exec.Cmd
	urls     []string // the engines' base URLs
	eargs    [][]string
	start    func(what string, args ...string) *exec.Cmd
}

// restartEngine starts engine i again with its arguments (same ports).
func (f *healthFleet) restartEngine(i int) {
	f.engines[i] = f.start("engine "+f.urls[i], f.eargs[i]...)
}

func startHealthFleet(t testing.TB, bin string, n int, engineArgs, sidecarArgs []string, pickerArgs ...string) *healthFleet {
	t.Helper()
	f := &healthFleet{}
	seed := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	start := func(what string, args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		startProcess(t, cmd, syscall.SIGTERM, func(out string) { t.Logf("%s output:\n%s", what, out) })
		return cmd
	}
	f.start = start
	for i := 0; i < n; i++ {
		httpPort, events, replay := testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)
		kvcfg := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:%d","replay_endpoint":"tcp://127.0.0.1:%d"}`, events, replay)
		url := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
		f.urls = append(f.urls, url)
		eargs := append([]string{"engine", "--host", "127.0.0.1", "--port", fmt.Sprint(httpPort),
			"--sim-time-scale", "0", "--num-gpu-blocks", "1024", "--max-model-len", "8192", "--kv-events-config", kvcfg,
			"--enable-prompt-tokens-details", "--log-level", "warn"}, engineArgs...)
		f.eargs = append(f.eargs, eargs)
		f.engines = append(f.engines, start("engine "+url, eargs...))
		gossipBind, join := "127.0.0.1:0", []string{"--join", seed}
		if i == 0 {
			gossipBind, join = seed, nil
		}
		f.sidecars = append(f.sidecars, start("sidecar "+url, append([]string{"sidecar", "--engine-url", url,
			"--kv-events", fmt.Sprintf("tcp://127.0.0.1:%d", events), "--kv-events-mode", "bind",
			"--replay", fmt.Sprintf("tcp://127.0.0.1:%d", replay), "--admin-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
			"--gossip-bind", gossipBind, "--node-name", fmt.Sprint("health-sidecar-", i), "--capacity", "4096", "--log-level", "warn"},
			append(join, sidecarArgs...)...)...))
	}
	api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	f.pickerP = start("picker", append([]string{"picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--gossip-bind", "127.0.0.1:0", "--join", seed,
		"--node-name", "health-picker", "--capacity", "4096", "--drain-delay", "0", "--log-level", "info"}, pickerArgs...)...)
	f.picker, f.admin = "http://"+api, "http://"+admin
	testnet.Await(t, 30*time.Second, 50*time.Millisecond, func() error {
		states, err := f.states()
		if err != nil {
			return err
		}
		for _, u := range f.urls {
			if states[u] != "cached" {
				return fmt.Errorf("the fleet is not healthy: states %v", states)
			}
		}
		return nil
	})
	return f
}

// states reads each endpoint's health state from the picker.
func (f *healthFleet) states() (map[string]string, error) {
	dbg, err := debugEndpoints(f.admin)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range dbg.Endpoints {
		out[e.Endpoint] = e.State
	}
	return out, nil
}

// awaitState waits (bounded) until url's state is want; it returns how
// long that took.
func (f *healthFleet) awaitState(t testing.TB, url, want string, within time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	testnet.Await(t, within, 20*time.Millisecond, func() error {
		s, err := f.states()
		if err != nil {
			return err
		}
		if s[url] != want {
			return fmt.Errorf("%s is %q, not %s (states %v)", url, s[url], want, s)
		}
		return nil
	})
	return time.Since(t0)
}

// metric sums the picker's series name whose labels include labels (nil:
// all of them).
func (f *healthFleet) metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return metrictest.Scraped(t, f.admin+"/metrics", name, labels)
}

// load sends non-streaming completions through the picker from workers
// goroutines until stop is closed (or a minute passes, five with spread),
// and records every failure. With spread every request has a salt of its
// own, so cold placement spreads them over every engine; without, each
// worker repeats a few prompts under its own salt (cache affinity).
type load struct {
	mu       sync.Mutex
	sent     int
	failures []string
	wg       sync.WaitGroup
	stop     chan struct{}
}

func startLoad(t testing.TB, picker string, workers int, spread bool) *load {
	l := &load{stop: make(chan struct{})}
	client := &http.Client{Timeout: 30 * time.Second}
	deadline := time.Now().Add(time.Minute)
	if spread {
		deadline = time.Now().Add(5 * time.Minute)
	}
	for w := 0; w < workers; w++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				salt := fmt.Sprint("w", w)
				if spread {
					salt = fmt.Sprint("w", w, "-", i)
				}
				body, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "max_tokens": 2, "cache_salt": salt,
					"prompt": strings.Repeat(fmt.Sprintf("Worker %d asks question %d about caches. ", w, i%7), 20)})
				resp, err := client.Post(picker+"/v1/completions", "application/json", bytes.NewReader(body))
				msg := ""
				if err != nil {
					msg = err.Error()
				} else {
					raw, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						msg = fmt.Sprintf("status %d: %.200s", resp.StatusCode, raw)
					}
				}
				l.mu.Lock()
				l.sent++
				if msg != "" {
					l.failures = append(l.failures, msg)
				}
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(l.end)
	return l
}

func (l *load) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// TestKilledEngineUnderLoad: an engine SIGKILLed under load gets no new
// pick after 1 s, and no non-streaming request fails (the picker retries
// the ones it sent there before anything was written).
func TestKilledEngineUnderLoad(t *testing.T) {
	bin := buildKvroute(t)
	f := startHealthFleet(t, bin, 3, nil, nil)
	l := startLoad(t, f.picker, 4, false)
	dead := f.urls[1]
	label := map[string]string{"engine": dead}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if f.metric(t, "kvroute_picker_selected_total", label) == 0 {
			return fmt.Errorf("no pick of %s yet", dead)
		}
		return nil
	})
	killed := time.Now()
	if err := f.engines[1].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := f.awaitState(t, dead, "down", 5*time.Second)
	t.Logf("down %v after SIGKILL", took.Round(time.Millisecond))
	if wait := time.Until(killed.Add(time.Second)); wait > 0 {
		<-time.After(wait) // the target's own second, not a settling sleep
	}
	picks := f.metric(t, "kvroute_picker_selected_total", label)
	sentBefore := func() int { l.mu.Lock(); defer l.mu.Unlock(); return l.sent }()
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := func() int { l.mu.Lock(); defer l.mu.Unlock(); return l.sent }(); n < sentBefore+200 {
			return fmt.Errorf("%d requests since", n-sentBefore)
		}
		return nil
	})
	if after := f.metric(t, "kvroute_picker_selected_total", label); after != picks {
		t.Fatalf("%v picks of the dead engine more than 1 s after SIGKILL (%v then %v)", after-picks, picks, after)
	}
	l.end()
	if len(l.failures) > 0 {
		t.Fatalf("%d of %d requests failed, e.g. %s", len(l.failures), l.sent, l.failures[0])
	}
	t.Logf("%d requests, none failed", l.sent)
}

// TestStoppedEngine: a SIGSTOPped (hung) engine is ejected within 3 s
// while requests keep flowing to the others; after SIGCONT it comes back.
func TestStoppedEngine(t *testing.T) {
	bin := buildKvroute(t)
	f := startHealthFleet(t, bin, 3, nil, nil)
	l := startLoad(t, f.picker, 4, false)
	hung := f.urls[2]
	cont := func() { _ = f.engines[2].Process.Signal(syscall.SIGCONT) }
	t.Cleanup(cont) // runs before the process's own cleanup stops it
	if err := f.engines[2].Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	took := f.awaitState(t, hung, "down", 3*time.Second)
	t.Logf("hung engine down %v after SIGSTOP", took.Round(time.Millisecond))
	// New requests complete on the others meanwhile (those already sent
	// to the hung engine wait for it: they are not failed).
	fresh := startLoad(t, f.picker, 2, true)
	sent := func() int { fresh.mu.Lock(); defer fresh.mu.Unlock(); return fresh.sent }
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if sent() < 100 {
			return fmt.Errorf("%d new requests completed while the engine hangs", sent())
		}
		return nil
	})
	fresh.end()
	if len(fresh.failures) > 0 {
		t.Fatalf("%d of %d new requests failed, e.g. %s", len(fresh.failures), fresh.sent, fresh.failures[0])
	}
	cont()
	back := f.awaitState(t, hung, "cached", 40*time.Second)
	t.Logf("back %v after SIGCONT", back.Round(time.Millisecond))
	l.end()
	if len(l.failures) > 0 {
		t.Fatalf("%d of %d requests failed, e.g. %s", len(l.failures), l.sent, l.failures[0])
	}
}

// TestKilledSidecarGrace: a SIGKILLed sidecar leaves its engine routable
// by load only for the grace period (it keeps answering the picker's
// probe), then the engine leaves the picker's view.
func TestKilledSidecarGrace(t *testing.T) {
	bin := buildKvroute(t)
	const grace = 3 * time.Second
	f := startHealthFleet(t, bin, 2, nil, nil, "--sidecar-grace", grace.String())
	orphan := f.urls[1]
	killed := time.Now()
	if err := f.sidecars[1].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := f.awaitState(t, orphan, "load_only", 5*time.Second)
	t.Logf("load-only %v after the sidecar's SIGKILL", took.Round(time.Millisecond))
	// Requests still reach it (by load), none fails.
	l := startLoad(t, f.picker, 2, false)
	label := map[string]string{"engine": orphan}
	picks := f.metric(t, "kvroute_picker_selected_total", label)
	testnet.Await(t, grace, 20*time.Millisecond, func() error {
		if f.metric(t, "kvroute_picker_selected_total", label) == picks {
			return fmt.Errorf("no pick of the orphaned engine")
		}
		return nil
	})
	if n := f.metric(t, "kvroute_picker_outcomes_total", map[string]string{"outcome": "load_only"}); n == 0 {
		t.Fatal("no load_only outcome counted for the orphaned engine's requests")
	}
	// After the grace the engine leaves.
	testnet.Await(t, grace+10*time.Second, 50*time.Millisecond, func() error {
		s, err := f.states()
		if err != nil {
			return err
		}
		if _, ok := s[orphan]; ok {
			return fmt.Errorf("still listed (%s) %v after the kill", s[orphan], time.Since(killed).Round(time.Millisecond))
		}
		return nil
	})
	if gone := time.Since(killed); gone < grace {
		t.Fatalf("left after %v, before the %v grace", gone, grace)
	}
	l.end()
	if len(l.failures) > 0 {
		t.Fatalf("%d of %d requests failed, e.g. %s", len(l.failures), l.sent, l.failures[0])
	}
}

// TestDrainedSidecar: a SIGTERMed sidecar tells the picker its engine is
// draining: the picker sends it no new request (none fails), verify says
// so, and when the sidecar leaves (a second signal cuts its drain short)
// the engine leaves the picker at once, with no grace period, though it
// still answers.
func TestDrainedSidecar(t *testing.T) {
	bin := buildKvroute(t)
	f := startHealthFleet(t, bin, 2, nil, []string{"--drain-delay", "1m"})
	l := startLoad(t, f.picker, 4, true)
	leaving := f.urls[1]
	label := map[string]string{"engine": leaving}
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if f.metric(t, "kvroute_picker_selected_total", label) == 0 {
			return fmt.Errorf("no pick of %s yet", leaving)
		}
		return nil
	})
	if err := f.sidecars[1].Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	took := f.awaitState(t, leaving, "draining", 5*time.Second)
	t.Logf("draining %v after the sidecar's SIGTERM", took.Round(time.Millisecond))
	sent := func() int { l.mu.Lock(); defer l.mu.Unlock(); return l.sent }
	// A pick decided just before the drain reached the picker may be
	// counted just after: let the requests in flight then finish (50 more
	// answered across the 4 workers) before taking the baseline.
	settled := sent()
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		if sent() < settled+50 {
			return fmt.Errorf("%d requests sent since the drain", sent()-settled)
		}
		return nil
	})
	picks := f.metric(t, "kvroute_picker_selected_total", label)
	n := sent()
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error { // 200 more requests, none to it
		if sent() < n+200 {
			return fmt.Errorf("%d requests sent since", sent()-n)
		}
		return nil
	})
	if now := f.metric(t, "kvroute_picker_selected_total", label); now != picks {
		t.Fatalf("%v new picks of the draining engine", now-picks)
	}
	r := runVerify(t, bin, "--picker", f.picker, "--picker-admin", f.admin, "--json")
	if r.code != 1 || !slices.Contains(r.failed(), "picker state "+leaving) || !strings.Contains(r.raw, "draining") {
		t.Fatalf("verify while draining: exit %d, failed %v\n%s", r.code, r.failed(), r.raw)
	}
	exited := make(chan error, 1)
	go func() { exited <- f.sidecars[1].Wait() }()
	if err := f.sidecars[1].Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the sidecar exited with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a second SIGTERM did not end the sidecar's minute-long drain within 15 s")
	}
	testnet.Await(t, 5*time.Second, 20*time.Millisecond, func() error {
		s, err := f.states()
		if err != nil {
			return err
		}
		if st, ok := s[leaving]; ok {
			return fmt.Errorf("the drained engine stays after its sidecar left: still listed (%s)", st)
		}
		return nil
	})
	if resp, err := http.Get(leaving + "/health"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the engine itself should still answer: %v", err)
	} else {
		resp.Body.Close()
	}
	l.end()
	if len(l.failures) > 0 {
		t.Fatalf("%d of %d requests failed, e.g. %s", len(l.failures), l.sent, l.failures[0])
	}
}

// TestStaleSummaryOutcome: an engine whose KV events arrive late (stale
// summary) caches more than the picker predicts, and the outcome says so.
func TestStaleSummaryOutcome(t *testing.T) {
	bin := buildKvroute(t)
	f := startHealthFleet(t, bin, 1, []string{"--sim-delay-events", "1500ms"}, nil)
	body, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "max_tokens": 2, "cache_salt": "stale",
		"prompt": strings.Repeat("A prompt whose blocks reach the picker late. ", 40)})
	for i := 0; i < 2; i++ { // the second runs before the first's events arrive
		postOK(t, f.picker+"/v1/completions", body)
	}
	if n := f.metric(t, "kvroute_picker_outcomes_total", map[string]string{"outcome": "more_cached_than_predicted"}); n != 1 {
		t.Fatalf("more_cached_than_predicted counted %v times, want 1", n)
	}
	if n := f.metric(t, "kvroute_picker_outcomes_total", map[string]string{"outcome": "as_predicted"}); n != 1 {
		t.Fatalf("as_predicted counted %v times, want 1 (the cold first request)", n)
	}
}

// postOK posts a JSON body and fails the test unless the answer is 200.
func postOK(t testing.TB, url string, body []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, raw)
	}
}

// BenchmarkKillToLastPick measures, per trial, the time from SIGKILLing an
// engine under load to the picker's last pick of it (the picker's
// selected_total for it, polled every 5 ms), then restarts the engine and
// waits until it is cached again. Run ≥ 20 trials:
//
//	go test -run '^$' -bench KillToLastPick -benchtime 20x ./test/e2e
func BenchmarkKillToLastPick(b *testing.B) {
	bin := buildKvroute(b)
	// The victim fails again right after each readmission, as a flapping
	// engine does, so the picker's ejection backoff doubles each trial; a
	// 2 s --eject-max keeps its readmission within the trial's wait. The
	// figure does not depend on it: a dead engine is ejected at its first
	// failure whatever the backoff.
	f := startHealthFleet(b, bin, 3, nil, nil, "--eject-max", "2s")
	l := startLoad(b, f.picker, 4, true)
	victim := f.urls[0]
	label := map[string]string{"engine": victim}
	var took []time.Duration
	for i := 0; i < b.N; i++ {
		before := f.metric(b, "kvroute_picker_selected_total", label)
		testnet.Await(b, 20*time.Second, 5*time.Millisecond, func() error {
			if f.metric(b, "kvroute_picker_selected_total", label) == before {
				s, _ := f.states()
				return fmt.Errorf("no pick of the engine in trial %d (states %v, %d requests sent)", i, s, func() int { l.mu.Lock(); defer l.mu.Unlock(); return l.sent }())
			}
			return nil
		})
		killed := time.Now()
		if err := f.engines[0].Process.Signal(syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		// Every pick of the dead engine timestamped (polled every 5 ms)
		// until 2 s pass without one: the last was the last.
		last, picks := killed, f.metric(b, "kvroute_picker_selected_total", label)
		testnet.Await(b, time.Minute, 5*time.Millisecond, func() error {
			if n := f.metric(b, "kvroute_picker_selected_total", label); n != picks {
				picks, last = n, time.Now()
			}
			if since := time.Since(last); since < 2*time.Second {
				return fmt.Errorf("the dead engine still picked %v ago (trial %d)", since.Round(time.Millisecond), i)
			}
			return nil
		})
		took = append(took, last.Sub(killed))
		_ = f.engines[0].Wait()
		f.restartEngine(0)
		f.awaitState(b, victim, "cached", 30*time.Second)
	}
	b.StopTimer()
	l.end()
	slices.Sort(took)
	q := func(p float64) float64 { return took[min(len(took)-1, int(p*float64(len(took))))].Seconds() * 1000 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(took[len(took)-1].Seconds()*1000, "max-ms")
	b.ReportMetric(0, "ns/op")
	if len(l.failures) > 0 {
		b.Errorf("%d of %d requests failed, e.g. %s", len(l.failures), l.sent, l.failures[0])
	}
}
