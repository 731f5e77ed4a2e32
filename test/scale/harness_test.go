package scale

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	// The staircase: per model, one prompt of as many blocks as the
	// model has sidecars, the i-th of which holds its first i+1 blocks
	// (stair[models[i]], depth[i]): one decision of it, explained, shows
	// what the picker credits every endpoint of the model.
	stair map[string][]uint32
	depth []int
}

// canaryTokens is a canary prompt's length: 4 blocks of 16.
const canaryTokens, canaryBlocks = 64, 4

// startSims starts n simulated sidecars, full 65,536-block summaries,
// spread evenly over models (named m00, m01, …; one model: "sim").
func startSims(b testing.TB, n, models int, c churn) *simFleet {
	b.Helper()
	f := &simFleet{bySim: map[string]int{}, stair: map[string][]uint32{}}
	params := summary.ForCapacity(capacity)
	per := (n + models - 1) / models
	var stairKeys []blockkey.Key
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
		if i%per == 0 { // the model's first sidecar: its staircase
			srng := rand.New(rand.NewPCG(uint64(i), 11))
			stair := make([]uint32, 16*min(per, n-i))
			for j := range stair {
				stair[j] = uint32(srng.IntN(150000))
			}
			f.stair[cfg.Model] = stair
			stairKeys = (&blockkey.Request{Tokens: stair, CacheSalt: "stair"}).AppendKeys(nil, cfg.Model, 16)
		}
		d := i%per + 1
		s.Hold(stairKeys[:d]...)
		f.sims, f.addrs, f.models, f.canary = append(f.sims, s), append(f.addrs, s.Addr()), append(f.models, cfg.Model), append(f.canary, canary)
		f.depth = append(f.depth, d)
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
	b        testing.TB
	bin      string
	args     []string
	base     string // http://127.0.0.1:port
	admin    string // the admin surface, http://127.0.0.1:port
	cmd      *exec.Cmd
	out      *bytes.Buffer
	mu       sync.Mutex // guards out and lastMiss
	lastMiss string     // the last canary routed elsewhere, for a failure's message
	noSync   bool       // the picker has no /debug/sync: its sync is read from /metrics
	started  time.Time
	exited   chan struct{}
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

// syncFromMetrics makes the waits read the picker's sync from /metrics
// (kvroute_picker_summary_updates_total{kind="snapshot"},
// kvroute_picker_snapshot_loads_waiting) rather than /debug/sync, as they
// do for a picker without it: to see what polling /metrics (600 KB at
// 1,000 endpoints, rendered and parsed a hundred times a second) costs a
// sync.
var syncFromMetrics = flag.Bool("scale.sync-from-metrics", false, "poll the picker's sync from /metrics, not /debug/sync")

// syncState is the snapshots the picker has received (their loads begun)
// and those not yet written into its index: from GET /debug/sync, small,
// or from /metrics (-scale.sync-from-metrics, or a picker without
// /debug/sync).
func (p *pickerProc) syncState() (snapshots, waiting float64, err error) {
	if !*syncFromMetrics && !p.noSync {
		resp, err := metricsClient.Get(p.admin + "/debug/sync")
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			p.noSync = true
		} else {
			var raw struct {
				Snapshots float64 `json:"snapshots"`
				Waiting   float64 `json:"snapshots_waiting"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
				return 0, 0, err
			}
			return raw.Snapshots, raw.Waiting, nil
		}
	}
	fams, err := metrictest.Fetch(p.admin + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	return metrictest.Sum(fams, "kvroute_picker_summary_updates_total", map[string]string{"kind": "snapshot"}),
		metrictest.Sum(fams, "kvroute_picker_snapshot_loads_waiting", nil), nil
}

// snapshotsApplied is the snapshots the picker has applied.
func (p *pickerProc) snapshotsApplied() (float64, error) {
	n, _, err := p.syncState()
	return n, err
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
// index (syncState), and returns the time since the process started.
func (p *pickerProc) awaitLoaded(n int, within time.Duration) time.Duration {
	p.b.Helper()
	p.awaitSync(n, within)
	testnet.Await(p.b, time.Until(p.started.Add(within)), 10*time.Millisecond, func() error {
		if _, v, err := p.syncState(); err != nil || v != 0 {
			return fmt.Errorf("snapshots still waiting to be loaded: %v (%v)", v, err)
		}
		return nil
	})
	return time.Since(p.started)
}

// awaitCredited polls, once the picker has applied as many snapshots as
// it follows endpoints (awaitSync), until one explained decision of each
// model's staircase credits every endpoint it follows (/debug/endpoints)
// with at least the blocks of it the endpoint holds (a decision credits
// only an endpoint routable with its cache known, from its summary as
// loaded into the index; each endpoint holds a different depth, so none
// is credited for another's). It returns the time since the process
// started. One decision a model: cheap beside a canary per endpoint.
func (p *pickerProc) awaitCredited(f *simFleet, n int, within time.Duration) time.Duration {
	p.b.Helper()
	p.awaitSync(n, within)
	// Every endpoint of the fleet, when the picker follows them all (a
	// model of at most maxGroup): /debug/endpoints (half a megabyte at
	// 1,000 endpoints) is then read after the wait, to check that it
	// follows no other; else only those it lists.
	followed := func() []string {
		var dbg debugapi.Document
		resp, err := metricsClient.Get(p.admin + debugapi.Path)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&dbg)
			resp.Body.Close()
		}
		if err != nil || len(dbg.Endpoints) != n {
			p.b.Fatalf("/debug/endpoints: %d endpoints of %d (%v)", len(dbg.Endpoints), n, err)
		}
		var out []string
		for _, e := range dbg.Endpoints {
			out = append(out, e.Endpoint)
		}
		return out
	}
	var eps []string
	if n < len(f.sims) {
		eps = followed()
	} else {
		for _, s := range f.sims {
			eps = append(eps, s.Endpoint())
		}
	}
	want := map[string]map[string]int{} // by model, by endpoint: the tokens held
	for _, e := range eps {
		i := f.bySim[e]
		if want[f.models[i]] == nil {
			want[f.models[i]] = map[string]int{}
		}
		want[f.models[i]][e] = 16 * f.depth[i]
	}
	testnet.Await(p.b, time.Until(p.started.Add(within)), 10*time.Millisecond, func() error {
		for model, eps := range want {
			if err := p.credited(model, f.stair[model], eps); err != nil {
				return err
			}
			delete(want, model) // a model once credited stays so: its summaries are loaded
		}
		return nil
	})
	at := time.Since(p.started)
	if n == len(f.sims) {
		followed()
	}
	return at
}

// credited asks the decision API, explained, for model's staircase and
// reports whether every endpoint of want is credited at least its tokens.
func (p *pickerProc) credited(model string, stair []uint32, want map[string]int) error {
	body, _ := json.Marshal(map[string]any{"model": model, "token_ids": stair, "cache_salt": "stair"})
	resp, err := metricsClient.Post(p.base+"/routing/v1/pick?explain=true", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var out struct {
		Candidates []struct {
			Endpoint      string `json:"endpoint"`
			MatchedTokens int    `json:"matched_tokens"`
		} `json:"candidates"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("model %s: status %d (%v)", model, resp.StatusCode, err)
	}
	short := 0
	got := map[string]int{}
	for _, c := range out.Candidates {
		got[c.Endpoint] = c.MatchedTokens
	}
	for e, n := range want {
		if got[e] < n {
			short++
		}
	}
	if short > 0 {
		return fmt.Errorf("model %s: %d endpoints of %d not credited their prefix", model, short, len(want))
	}
	return nil
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
	deadline := p.started.Add(within)
	testnet.Await(p.b, time.Until(deadline), 10*time.Millisecond, func() error {
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
			err := fmt.Errorf("%d endpoints of %d not routable", len(left), n)
			if time.Until(deadline) < time.Second { // the last polls: say why, for the failure
				err = fmt.Errorf("%w: %s", err, p.whyNotRoutable(f, left))
			}
			return err
		}
		return nil
	})
	return time.Since(p.started)
}

// whyNotRoutable describes up to 5 endpoints of left: their state in
// /debug/endpoints and the answer to their canary.
func (p *pickerProc) whyNotRoutable(f *simFleet, left map[int]bool) string {
	var dbg debugapi.Document
	resp, err := metricsClient.Get(p.admin + debugapi.Path)
	if err == nil {
		err = json.NewDecoder(resp.Body).Decode(&dbg)
		resp.Body.Close()
	}
	if err != nil {
		return fmt.Sprintf("/debug/endpoints: %v", err)
	}
	var out []string
	for i := range left {
		if len(out) == 5 {
			break
		}
		url := f.sims[i].Endpoint()
		state := "absent from /debug/endpoints"
		for _, e := range dbg.Endpoints {
			if e.Endpoint == url {
				state = fmt.Sprintf("state %s (%s), stream %s (%s), %.1f s since an update", e.State, e.StateReason, e.StreamState, e.StreamReason, e.StaleSecs)
			}
		}
		_, answer := p.canary(f, i)
		out = append(out, fmt.Sprintf("%s: %s; canary: %s", url, state, answer))
	}
	p.mu.Lock()
	out = append(out, "the last canary missed: "+p.lastMiss)
	p.mu.Unlock()
	for _, s := range dbg.SidecarsFailing {
		if len(out) == 10 {
			break
		}
		out = append(out, fmt.Sprintf("sidecar %s failing: %s: %s", s.Sidecar, s.Reason, s.Error))
	}
	return strings.Join(out, "; ")
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
	ok, _ := p.canary(f, i)
	return ok
}

// canary is canaryRouted, and the answer.
func (p *pickerProc) canary(f *simFleet, i int) (bool, string) {
	body, _ := json.Marshal(map[string]any{"model": f.models[i], "token_ids": f.canary[i], "cache_salt": "canary"})
	resp, err := metricsClient.Post(p.base+"/routing/v1/pick", "application/json", bytes.NewReader(body))
	if err != nil {
		p.mu.Lock()
		p.lastMiss = err.Error() + " at " + time.Since(p.started).Round(time.Millisecond).String()
		p.mu.Unlock()
		return false, err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out struct {
		Endpoint      string `json:"endpoint"`
		MatchedBlocks int    `json:"matched_blocks"`
		Reason        string `json:"reason"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil {
		return false, fmt.Sprintf("status %d: %.200s", resp.StatusCode, raw)
	}
	ok := out.Endpoint == f.sims[i].Endpoint() && out.MatchedBlocks == canaryBlocks
	answer := fmt.Sprintf("%s, %d blocks matched (%s)", out.Endpoint, out.MatchedBlocks, out.Reason)
	if !ok {
		p.mu.Lock()
		p.lastMiss = answer + " at " + time.Since(p.started).Round(time.Millisecond).String()
		p.mu.Unlock()
	}
	return ok, answer
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
