package scale

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// capacity is the blocks per endpoint every shape's summaries are sized
// for (summary.ForCapacity), the picker's default --capacity.
const capacity = 65536

// churn is the turnover of every simulated sidecar in the process-level
// benchmarks: light, so that a thousand sidecars and the pickers fit on
// two cores (the 1,000 blocks/s a second per endpoint, every
// 10 ms, is a million blocks and 100,000 deltas a second fleet-wide).
type churn struct {
	rate     int           // blocks stored (and evicted) per second per endpoint; 0 with interval 0: a still sidecar
	interval time.Duration // between deltas
}

var lightChurn = churn{rate: 10, interval: 100 * time.Millisecond}

// simFleet is the simulated sidecars of one shape.
type simFleet struct {
	sims   []*simsidecar.Sidecar
	addrs  []string
	models []string   // each sidecar's model
	canary [][]uint32 // each sidecar's canary: a 64-token prompt only it holds, whole
	bySim  map[string]int
}

// canaryTokens is a canary prompt's length: 4 blocks of 16.
const canaryTokens, canaryBlocks = 64, 4

// startSims starts n simulated sidecars, full 65,536-block summaries,
// spread evenly over models (named m00, m01, …; one model: "sim").
func startSims(b testing.TB, n, models int, c churn) *simFleet {
	b.Helper()
	f := &simFleet{bySim: map[string]int{}}
	params := summary.ForCapacity(capacity)
	per := (n + models - 1) / models
	for i := range n {
		cfg := simsidecar.Config{Index: i, Params: params, Rate: c.rate, Interval: c.interval, Still: c.interval == 0}
		if models > 1 {
			cfg.Model = fmt.Sprintf("m%02d", i/per)
		}
		if cfg.Model == "" {
			cfg.Model = "sim"
		}
		s := simsidecar.Start(b, cfg)
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		canary := make([]uint32, canaryTokens)
		for j := range canary {
			canary[j] = uint32(rng.IntN(150000))
		}
		s.Hold((&blockkey.Request{Tokens: canary, CacheSalt: "canary"}).AppendKeys(nil, cfg.Model, 16)...)
		f.sims, f.addrs, f.models, f.canary = append(f.sims, s), append(f.addrs, s.Addr()), append(f.models, cfg.Model), append(f.canary, canary)
		f.bySim[s.Endpoint()] = i
	}
	return f
}

// sent is the bytes the fleet's sidecars have sent on summary streams.
func (f *simFleet) sent() int64 {
	var n int64
	for _, s := range f.sims {
		n += s.Sent()
	}
	return n
}

// holdPrompts makes two random endpoints among the first n (all of
// model) hold each prompt's prefix, at a random depth each.
func (f *simFleet) holdPrompts(model string, prompts [][]uint32, salt string, n int) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range prompts {
		chain := (&blockkey.Request{Tokens: p, CacheSalt: salt}).AppendKeys(nil, model, 16)
		for range 2 {
			f.sims[rng.IntN(n)].Hold(chain[:rng.IntN(len(chain)+1)]...)
		}
	}
}

func randomPrompts(n, tokens int) [][]uint32 {
	rng := rand.New(rand.NewPCG(3, 4))
	out := make([][]uint32, n)
	for i := range out {
		out[i] = make([]uint32, tokens)
		for j := range out[i] {
			out[i][j] = uint32(rng.IntN(150000))
		}
	}
	return out
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// kvrouteBinary builds the binary once per run (into a directory removed
// by TestMain).
func kvrouteBinary(b testing.TB) string {
	b.Helper()
	buildOnce.Do(func() {
		binPath = filepath.Join(tmpDir, "kvroute")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/kvroute")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		b.Fatal(buildErr)
	}
	return binPath
}

var tmpDir string

func TestMain(m *testing.M) {
	var err error
	if tmpDir, err = os.MkdirTemp("", "kvroute-scale"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmpDir)
	os.Exit(code)
}

// pickerProc is one `kvroute picker` process following the fleet.
type pickerProc struct {
	b       testing.TB
	bin     string
	args    []string
	base    string // http://127.0.0.1:port
	admin   string // the admin surface, http://127.0.0.1:port
	cmd     *exec.Cmd
	out     *bytes.Buffer
	mu      sync.Mutex // guards out
	started time.Time
	exited  chan struct{}
}

// startPicker runs a picker following addrs (gossip off, no gRPC
// listener), killed when the benchmark ends.
func startPicker(b testing.TB, addrs []string, extra ...string) *pickerProc {
	b.Helper()
	p := &pickerProc{b: b, bin: kvrouteBinary(b), base: fmt.Sprintf("http://127.0.0.1:%d", testnet.FreePort(b)),
		admin: fmt.Sprintf("http://127.0.0.1:%d", testnet.FreePort(b))}
	list := filepath.Join(b.TempDir(), "picker.json")
	cfg, _ := json.Marshal(map[string]string{"sidecars": strings.Join(addrs, ",")})
	if err := os.WriteFile(list, cfg, 0o600); err != nil {
		b.Fatal(err)
	}
	p.args = append([]string{"picker", "--listen", strings.TrimPrefix(p.base, "http://"), "--admin-listen", strings.TrimPrefix(p.admin, "http://"), "--grpc-listen", "", "--gossip-bind", "",
		"--config", list, "--capacity", strconv.Itoa(capacity), "--drain-delay", "0", "--log-level", "warn"}, extra...)
	p.start()
	b.Cleanup(p.kill)
	return p
}

// pickerEnv is extra environment for the picker processes only (the
// benchmark process, which holds the simulated sidecars, keeps its own):
// for example GOMEMLIMIT=400MiB, to see what a soft memory limit does to
// the picker's peak and its sync.
var pickerEnv = flag.String("scale.picker-env", "", "comma-separated KEY=VALUE pairs added to the picker processes' environment")

func (p *pickerProc) start() {
	p.out = &bytes.Buffer{}
	p.cmd = exec.Command(p.bin, p.args...)
	if *pickerEnv != "" {
		p.cmd.Env = append(os.Environ(), strings.Split(*pickerEnv, ",")...)
	}
	w := writerFunc(func(b []byte) (int, error) { p.mu.Lock(); defer p.mu.Unlock(); return p.out.Write(b) })
	p.cmd.Stdout, p.cmd.Stderr = w, w
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		p.b.Fatal(err)
	}
	p.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(p.cmd, p.exited)
}

// kill stops the process (SIGKILL: a crash, and no drain) and waits for it.
func (p *pickerProc) kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.b.Errorf("picker %d did not exit after SIGKILL", p.cmd.Process.Pid)
	}
	p.cmd = nil
}

// restart kills the process and starts it again, same arguments and port.
func (p *pickerProc) restart() {
	p.kill()
	p.start()
}

func (p *pickerProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

var metricsClient = &http.Client{Timeout: 5 * time.Second}

// metric is the sum of the series of family name whose labels include
// labels (nil: all) on the picker's /metrics page; absent: 0.
func (p *pickerProc) metric(name string, labels map[string]string) (float64, error) {
	fams, err := metrictest.Fetch(p.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	return metrictest.Sum(fams, name, labels), nil
}

// snapshotsApplied is the snapshots the picker has applied.
func (p *pickerProc) snapshotsApplied() (float64, error) {
	return p.metric("kvroute_picker_summary_updates_total", map[string]string{"kind": "snapshot"})
}

// awaitSync polls until the picker has applied n snapshots (every
// endpoint's, once each after a start) and returns the time since the
// process started; it fails the benchmark past within, or at once when
// the picker exits.
func (p *pickerProc) awaitSync(n int, within time.Duration) time.Duration {
	p.b.Helper()
	testnet.Await(p.b, within, 10*time.Millisecond, func() error {
		select {
		case <-p.exited:
			p.b.Fatalf("picker exited:\n%s", p.output())
		default:
		}
		if last, err := p.snapshotsApplied(); err != nil || last < float64(n) {
			return fmt.Errorf("picker not synced: %v snapshots of %d (%v)\n%s", last, n, err, p.output())
		}
		return nil
	})
	return time.Since(p.started)
}

// awaitLoaded polls, once the picker has applied n snapshots
// (awaitSync), until it has no snapshot waiting to be written into its
// index (kvroute_picker_snapshot_loads_waiting 0), and returns the time
// since the process started.
func (p *pickerProc) awaitLoaded(n int, within time.Duration) time.Duration {
	p.b.Helper()
	p.awaitSync(n, within)
	testnet.Await(p.b, time.Until(p.started.Add(within)), 10*time.Millisecond, func() error {
		if v, err := p.metric("kvroute_picker_snapshot_loads_waiting", nil); err != nil || v != 0 {
			return fmt.Errorf("snapshots still waiting to be loaded: %v (%v)", v, err)
		}
		return nil
	})
	return time.Since(p.started)
}

// awaitRoutable polls, once the picker has applied as many snapshots as
// it follows endpoints (awaitSync), until every endpoint it follows
// (/debug/endpoints) is routed its canary with the canary's whole prefix
// matched: its summary is loaded into the index, not merely received.
// It returns the time since the process started.
func (p *pickerProc) awaitRoutable(f *simFleet, n int, within time.Duration) time.Duration {
	p.b.Helper()
	p.awaitSync(n, within)
	var dbg debugapi.Document
	resp, err := metricsClient.Get(p.admin + debugapi.Path)
	if err == nil {
		err = json.NewDecoder(resp.Body).Decode(&dbg)
		resp.Body.Close()
	}
	if err != nil || len(dbg.Endpoints) != n {
		p.b.Fatalf("/debug/endpoints: %d endpoints of %d (%v)", len(dbg.Endpoints), n, err)
	}
	left := map[int]bool{}
	for _, e := range dbg.Endpoints {
		left[f.bySim[e.Endpoint]] = true
	}
	// The loads run interleaved and finish close together: one canary at
	// a time until one is routed, then (at once) sweeps of all that are
	// left, so the check's own decisions hardly compete with the loads.
	sweep := false
	testnet.Await(p.b, time.Until(p.started.Add(within)), 10*time.Millisecond, func() error {
		if !sweep {
			for i := range left {
				if p.canaryRouted(f, i) {
					delete(left, i)
					sweep = true
				}
				break
			}
		}
		if sweep {
			p.sweep(f, left)
		}
		if len(left) > 0 {
			return fmt.Errorf("%d endpoints of %d not routable", len(left), n)
		}
		return nil
	})
	return time.Since(p.started)
}

// sweep asks for the canary of every endpoint left, four at a time, and
// removes from left those routed.
func (p *pickerProc) sweep(f *simFleet, left map[int]bool) {
	todo := make(chan int, len(left))
	for i := range left {
		todo <- i
	}
	close(todo)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range todo {
				if p.canaryRouted(f, i) {
					mu.Lock()
					delete(left, i)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
}

// canaryRouted asks the decision API for sidecar i's canary and reports
// whether it went to i's endpoint with its whole prefix matched.
func (p *pickerProc) canaryRouted(f *simFleet, i int) bool {
	body, _ := json.Marshal(map[string]any{"model": f.models[i], "token_ids": f.canary[i], "cache_salt": "canary"})
	resp, err := metricsClient.Post(p.base+"/routing/v1/pick", "application/json", bytes.NewReader(body))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var out struct {
		Endpoint      string `json:"endpoint"`
		MatchedBlocks int    `json:"matched_blocks"`
	}
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&out) == nil &&
		out.Endpoint == f.sims[i].Endpoint() && out.MatchedBlocks == canaryBlocks
}

// memory is VmRSS and VmHWM from /proc/<pid>/status, in MiB.
func (p *pickerProc) memory() (rss, hwm float64) {
	p.b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		p.b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			hwm = kb / 1024
		}
	}
	return rss, hwm
}

// cpu is the process's user+system CPU time so far (/proc/<pid>/stat,
// in clock ticks of 1/100 s, Linux's USER_HZ).
func (p *pickerProc) cpu() time.Duration {
	p.b.Helper()
	return procCPU(p.b, p.cmd.Process.Pid)
}

func procCPU(b testing.TB, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (in parentheses, which may hold
	// spaces): state is field 3, utime 14, stime 15.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// median of ds (sorted in place).
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
