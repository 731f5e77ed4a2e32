package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
)

// A fleet of real processes (kvroute engine, sidecar and picker, the
// running binary exec'ed), for the faults scenario: SIGKILL and SIGSTOP
// need processes. Everything listens on 127.0.0.1 on ports picked free at
// start and kept across restarts; gossip is memberlist, every member
// joining every other.

// procFleetConfig shapes a process fleet.
type procFleetConfig struct {
	Bin         string // the kvroute binary
	Engines     int
	Pickers     int
	GPUBlocks   int
	MaxModelLen int
	TimeScale   float64
	DrainDelay  time.Duration // the pickers' --drain-delay
	LogDir      string        // each process's output, a file each
	Ready       time.Duration // bound on the fleet coming up
	// Profile is the engines' --profile ("" leaves the engine's default,
	// sim-default); their capacity and context stay GPUBlocks and
	// MaxModelLen.
	Profile string
}

// proc is one process, restartable with the same arguments.
type proc struct {
	name string
	bin  string
	args []string
	log  *os.File

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the current process has exited
	stopped bool          // SIGSTOPped
}

// start execs the process; its children die with this process.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(p.log, "--- %s start %s\n", time.Now().Format(time.RFC3339Nano), p.name)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.cmd, p.exited, p.stopped = cmd, exited, false
	return nil
}

// pid is the running process's id (0 when it has exited).
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	select {
	case <-p.exited:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s: not started", p.name)
	}
	fmt.Fprintf(p.log, "--- %s signal %v\n", time.Now().Format(time.RFC3339Nano), sig)
	p.stopped = sig == syscall.SIGSTOP || (p.stopped && sig != syscall.SIGCONT)
	return p.cmd.Process.Signal(sig)
}

// wait waits up to d for the running process to exit.
func (p *proc) wait(d time.Duration) error {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-exited:
		return nil
	case <-t.C:
		return fmt.Errorf("%s did not exit within %v", p.name, d)
	}
}

// stop ends the process: SIGCONT if stopped, SIGTERM, SIGKILL after d.
func (p *proc) stop(d time.Duration) {
	if p.pid() == 0 {
		return
	}
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	if stopped {
		_ = p.signal(syscall.SIGCONT)
	}
	_ = p.signal(syscall.SIGTERM)
	if p.wait(d) != nil {
		_ = p.signal(syscall.SIGKILL)
		_ = p.wait(10 * time.Second)
	}
}

// procEngine is an engine process and its sidecar.
type procEngine struct {
	url             string // http://127.0.0.1:port
	engine, sidecar *proc
	sidecarDebug    string // http://127.0.0.1:port of the sidecar's debug listener
}

// procPicker is a picker process.
type procPicker struct {
	url   string // the public API
	admin string // the admin surface: /readyz, /metrics, /debug/*
	p     *proc
}

// procFleet is a running process fleet.
type procFleet struct {
	cfg     procFleetConfig
	engines []*procEngine
	pickers []*procPicker
	logs    []*os.File
	ports   map[int]bool
}

// freePort returns a port free on 127.0.0.1 (TCP and UDP), drawn at
// random below the kernel's ephemeral range so no socket bound to port 0
// takes it before the process binds it, and not handed out before.
func (f *procFleet) freePort() (int, error) {
	hi := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if fs := strings.Fields(string(b)); len(fs) == 2 {
			if n, err := strconv.Atoi(fs[0]); err == nil && n > 2048 {
				hi = n
			}
		}
	}
	lo := max(1024, hi-20000)
	for i := 0; i < 1000; i++ {
		p := lo + rand.IntN(hi-lo)
		if f.ports[p] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			continue
		}
		u.Close()
		f.ports[p] = true
		return p, nil
	}
	return 0, errors.New("no free port on 127.0.0.1")
}

// startProcFleet starts the engines, a sidecar each and the pickers, and
// waits until every picker is ready and routes every engine with its
// cache (state cached).
func startProcFleet(ctx context.Context, cfg procFleetConfig) (*procFleet, error) {
	f := &procFleet{cfg: cfg, ports: map[int]bool{}}
	fail := func(err error) (*procFleet, error) {
		f.Close()
		return nil, err
	}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return nil, err
	}
	newProc := func(name string, args ...string) (*proc, error) {
		lf, err := os.Create(filepath.Join(cfg.LogDir, name+".log"))
		if err != nil {
			return nil, err
		}
		f.logs = append(f.logs, lf)
		return &proc{name: name, bin: cfg.Bin, args: args, log: lf}, nil
	}
	ports := func(n int) ([]int, error) {
		out := make([]int, n)
		for i := range out {
			p, err := f.freePort()
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	}
	// Gossip ports first: everyone joins everyone.
	gp, err := ports(cfg.Engines + cfg.Pickers)
	if err != nil {
		return fail(err)
	}
	var join []string
	for _, p := range gp {
		join = append(join, fmt.Sprintf("127.0.0.1:%d", p))
	}
	joinFlag := strings.Join(join, ",")
	capacity := strconv.Itoa(cfg.GPUBlocks)
	for i := 0; i < cfg.Engines; i++ {
		pp, err := ports(5) // http, events, replay, sidecar debug, sidecar gRPC
		if err != nil {
			return fail(err)
		}
		e := &procEngine{url: fmt.Sprintf("http://127.0.0.1:%d", pp[0]), sidecarDebug: fmt.Sprintf("http://127.0.0.1:%d", pp[3])}
		kv := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:%d","replay_endpoint":"tcp://127.0.0.1:%d"}`, pp[1], pp[2])
		args := []string{"--host", "127.0.0.1", "--port", strconv.Itoa(pp[0]),
			"--sim-time-scale", strconv.FormatFloat(cfg.TimeScale, 'g', -1, 64), "--num-gpu-blocks", capacity,
			"--max-model-len", strconv.Itoa(cfg.MaxModelLen), "--kv-events-config", kv, "--enable-prompt-tokens-details", "--log-level", "warn"}
		if cfg.Profile != "" {
			args = append(args, "--profile", cfg.Profile)
		}
		if e.engine, err = newProc(fmt.Sprint("engine-", i), append([]string{"engine"}, args...)...); err != nil {
			return fail(err)
		}
		if e.sidecar, err = newProc(fmt.Sprint("sidecar-", i), "sidecar", "--engine-url", e.url,
			"--kv-events", fmt.Sprintf("tcp://127.0.0.1:%d", pp[1]), "--kv-events-mode", "bind", "--replay", fmt.Sprintf("tcp://127.0.0.1:%d", pp[2]),
			"--admin-listen", fmt.Sprintf("127.0.0.1:%d", pp[3]), "--grpc-listen", fmt.Sprintf("127.0.0.1:%d", pp[4]),
			"--gossip-bind", join[i], "--gossip-ports", "1", "--join", joinFlag, "--node-name", fmt.Sprint("faults-sidecar-", i),
			"--capacity", capacity, "--scrape-interval", "100ms", "--fault-injection", "--log-level", "warn"); err != nil {
			return fail(err)
		}
		f.engines = append(f.engines, e)
	}
	for i := 0; i < cfg.Pickers; i++ {
		p, err := f.freePort()
		if err != nil {
			return fail(err)
		}
		a, err := f.freePort()
		if err != nil {
			return fail(err)
		}
		pk := &procPicker{url: fmt.Sprintf("http://127.0.0.1:%d", p), admin: fmt.Sprintf("http://127.0.0.1:%d", a)}
		if pk.p, err = newProc(fmt.Sprint("picker-", i), "picker", "--listen", fmt.Sprintf("127.0.0.1:%d", p), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", a), "--grpc-listen", "",
			"--gossip-bind", join[cfg.Engines+i], "--gossip-ports", "1", "--join", joinFlag, "--node-name", fmt.Sprint("faults-picker-", i),
			"--capacity", capacity, "--drain-delay", cfg.DrainDelay.String(), "--shutdown-timeout", "30s", "--log-level", "warn"); err != nil {
			return fail(err)
		}
		f.pickers = append(f.pickers, pk)
	}
	for _, e := range f.engines {
		if err := e.engine.start(); err != nil {
			return fail(err)
		}
	}
	for _, e := range f.engines {
		if err := e.sidecar.start(); err != nil {
			return fail(err)
		}
	}
	for _, p := range f.pickers {
		if err := p.p.start(); err != nil {
			return fail(err)
		}
	}
	if err := f.awaitHealthy(ctx, cfg.Ready); err != nil {
		return fail(fmt.Errorf("the process fleet never came up (logs in %s): %w", cfg.LogDir, err))
	}
	return f, nil
}

// httpOK says whether GET url answers 200 within a second.
func httpOK(ctx context.Context, url string) error {
	return getOK(ctx, url, time.Second, func(io.Reader) error { return nil })
}

// getOK GETs url within timeout and hands a 200 answer's body to read;
// another status is an error quoting the start of the body.
func getOK(ctx context.Context, url string, timeout time.Duration, read func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return read(resp.Body)
}

// getJSON decodes GET url's answer into out.
func getJSON(ctx context.Context, url string, out any) error {
	return getOK(ctx, url, 5*time.Second, func(r io.Reader) error { return json.NewDecoder(r).Decode(out) })
}

// await polls cond every 50 ms until it holds, ctx ends or d passes.
func await(ctx context.Context, d time.Duration, cond func() error) error {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("not within %v: %w", d, err)
		case <-tick.C:
		}
	}
}

// awaitHealthy waits until every picker is ready and has every engine in
// state cached.
func (f *procFleet) awaitHealthy(ctx context.Context, d time.Duration) error {
	return await(ctx, d, func() error {
		for _, p := range f.pickers {
			if err := httpOK(ctx, p.admin+"/readyz"); err != nil {
				return err
			}
			states, err := pickerStates(ctx, p.admin)
			if err != nil {
				return err
			}
			for _, e := range f.engines {
				if states[e.url] != "cached" {
					return fmt.Errorf("picker %s: engine states %v", p.url, states)
				}
			}
		}
		return nil
	})
}

// pickerStates reads each endpoint's state from a picker's
// /debug/endpoints.
func pickerStates(ctx context.Context, base string) (map[string]string, error) {
	var dbg debugapi.Document
	if err := getJSON(ctx, base+debugapi.Path, &dbg); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range dbg.Endpoints {
		out[e.Endpoint] = e.State
	}
	return out, nil
}

// Close stops every process (pickers first) and closes the logs.
func (f *procFleet) Close() {
	var wg sync.WaitGroup
	stopAll := func(ps []*proc) {
		for _, p := range ps {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop(10 * time.Second) }()
		}
		wg.Wait()
	}
	var pk, sc, en []*proc
	for _, p := range f.pickers {
		pk = append(pk, p.p)
	}
	for _, e := range f.engines {
		sc, en = append(sc, e.sidecar), append(en, e.engine)
	}
	stopAll(pk)
	stopAll(sc)
	stopAll(en)
	for _, l := range f.logs {
		l.Close()
	}
}
