package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// streamPod is an engine process and its sidecar process on loopback.
type streamPod struct {
	engine, debug, grpc string // URLs / addresses
	events              string // the engine's kv-events endpoint
	sidecarOut          *output
	engineCmd           *exec.Cmd
	engineArgs          []string
}

// podState is the part of a rank's /debug/state entry these tests read.
type podState struct {
	StreamState  string `json:"stream_state"`
	StreamReason string `json:"stream_reason"`
	EngineDown   bool   `json:"engine_down"`
	EngineError  string `json:"engine_error"`
	Blocks       map[string]int
	Load         struct {
		At time.Time `json:"scraped_at"`
	} `json:"load"`
}

// startStreamPod runs `kvroute engine` with its events endpoint naming
// 127.0.0.1 (so the engine connects, as vLLM does with a concrete host)
// and `kvroute sidecar` in the given mode, with or without replay; it
// returns once the sidecar has scraped the engine and knows its block size.
func startStreamPod(t *testing.T, bin, mode string, replay bool) *streamPod {
	t.Helper()
	httpPort, events, replayPort, grpcPort := testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)
	p := &streamPod{engine: fmt.Sprintf("http://127.0.0.1:%d", httpPort), events: fmt.Sprintf("tcp://127.0.0.1:%d", events),
		debug: fmt.Sprintf("http://127.0.0.1:%d", testnet.FreePort(t)), grpc: fmt.Sprintf("127.0.0.1:%d", grpcPort)}
	kvcfg := fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":%q,"replay_endpoint":"tcp://127.0.0.1:%d"}`, p.events, replayPort)
	p.engineArgs = []string{"engine", "--host", "127.0.0.1", "--port", fmt.Sprint(httpPort), "--sim-time-scale", "0",
		"--num-gpu-blocks", "1024", "--max-model-len", "4096", "--kv-events-config", kvcfg, "--log-level", "warn"}
	p.startEngine(t, bin)
	replayFlag := ""
	if replay {
		replayFlag = fmt.Sprintf("tcp://127.0.0.1:%d", replayPort)
	}
	p.sidecarOut = run(t, bin, "sidecar", "--engine-url", p.engine, "--kv-events", p.events, "--kv-events-mode", mode,
		"--replay", replayFlag, "--admin-listen", strings.TrimPrefix(p.debug, "http://"), "--grpc-listen", p.grpc,
		"--gossip-bind", "", "--capacity", "4096", "--log-level", "info")
	// Wait for the sidecar's first scrape: the baseline the engine's first
	// request is measured against.
	testnet.Await(t, 30*time.Second, 20*time.Millisecond, func() error {
		st, err := p.state()
		if err != nil {
			return err
		}
		if st.StreamState != "unknown" || !strings.Contains(st.StreamReason, "stored no new block") {
			return fmt.Errorf("the sidecar has not scraped the engine: state %s: %s", st.StreamState, st.StreamReason)
		}
		return nil
	})
	return p
}

// startEngine starts (or restarts) the engine process.
func (p *streamPod) startEngine(t *testing.T, bin string) {
	t.Helper()
	p.engineCmd = exec.Command(bin, p.engineArgs...)
	startProcess(t, p.engineCmd, syscall.SIGTERM, func(out string) { t.Logf("engine output:\n%s", out) })
}

func (p *streamPod) state() (podState, error) {
	var st []podState
	if err := getJSON(p.debug+"/debug/state", &st); err != nil {
		return podState{}, err
	}
	if len(st) != 1 {
		return podState{}, fmt.Errorf("%d ranks", len(st))
	}
	return st[0], nil
}

// request sends a completion of n distinct tokens from base (n/16 new
// blocks).
func (p *streamPod) request(t *testing.T, n, base int) {
	t.Helper()
	toks := make([]int, n)
	for i := range toks {
		toks[i] = base + i
	}
	body, _ := json.Marshal(map[string]any{"prompt": toks, "max_tokens": 1})
	resp, err := http.Post(p.engine+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("completion: %d", resp.StatusCode)
	}
}

// gauge reads the sidecar's kvroute_sidecar_stream_state by state (a
// state with no series is absent).
func (p *streamPod) gauge(t *testing.T) map[string]float64 {
	t.Helper()
	fams := metrictest.Families(t, p.debug+"/metrics")
	out := map[string]float64{}
	for _, s := range []string{"unknown", "live", "replay_only", "silent", "partial"} {
		if l := map[string]string{"state": s}; metrictest.Series(fams, "kvroute_sidecar_stream_state", l) > 0 {
			out[s] = metrictest.Sum(fams, "kvroute_sidecar_stream_state", l)
		}
	}
	return out
}

// gaugeIs says whether the stream state gauge g has a series for each
// state of want, at want's value.
func gaugeIs(g map[string]float64, want map[string]float64) bool {
	for s, v := range want {
		if got, ok := g[s]; !ok || got != v {
			return false
		}
	}
	return true
}

// transition is one of the sidecar's stream transition log lines (zap's
// JSON).
type transition struct {
	Level, Msg, From, State, Reason string
}

// transitions returns the sidecar's stream transition log lines.
func (p *streamPod) transitions(t *testing.T) []transition {
	t.Helper()
	var out []transition
	for _, l := range strings.Split(p.sidecarOut.String(), "\n") {
		if !strings.Contains(l, "kv event stream state changed") {
			continue
		}
		var tr transition
		if err := json.Unmarshal([]byte(l), &tr); err != nil || tr.Msg != "kv event stream state changed" {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, tr)
	}
	return out
}

// scrapesPast waits (bounded) until the sidecar has scraped the engine
// after t0: the state shown is then judged on evidence up to t0.
func (p *streamPod) scrapesPast(t *testing.T, t0 time.Time) podState {
	t.Helper()
	var st podState
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		var err error
		if st, err = p.state(); err != nil {
			return err
		}
		if !st.Load.At.After(t0) {
			return fmt.Errorf("last scrape at %v", st.Load.At)
		}
		return nil
	})
	return st
}

// TestStreamMismatchReported: an engine whose events endpoint names
// 127.0.0.1 connects out, and a sidecar in its default connect mode then
// gets no live batch. Without replay the sidecar reports the stream silent
// within 5 s of the engine's first request; with replay (batches come only
// through its idle catch-ups) replay_only. Either way in /debug/state with
// the bind hint, in the gauge and in one warning, which later scrapes do
// not repeat; /readyz stays ready (the sidecar serves load).
func TestStreamMismatchReported(t *testing.T) {
	bin := buildKvroute(t)
	for _, tc := range []struct {
		name   string
		replay bool
		want   string
	}{
		{"no replay: silent", false, "silent"},
		{"replay: replay_only", true, "replay_only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startStreamPod(t, bin, "connect", tc.replay)
			t0 := time.Now()
			p.request(t, 160, 5000) // 10 new blocks
			var st podState
			testnet.Await(t, 5*time.Second-time.Since(t0), 20*time.Millisecond, func() error {
				var err error
				if st, err = p.state(); err != nil {
					return err
				}
				if st.StreamState != tc.want {
					return fmt.Errorf("state %s (%s) after %v", st.StreamState, st.StreamReason, time.Since(t0)) // run logs the sidecar's output
				}
				return nil
			})
			took := time.Since(t0)
			t.Logf("%s %v after the engine's first request", tc.want, took.Round(time.Millisecond))
			if !strings.Contains(st.StreamReason, "--kv-events-mode bind") || !strings.Contains(st.StreamReason, "new blocks") {
				t.Fatalf("reason %q lacks the hint", st.StreamReason)
			}
			if g := p.gauge(t); !gaugeIs(g, map[string]float64{tc.want: 1, "live": 0, "unknown": 0}) {
				t.Fatalf("gauge %v", g)
			}
			var ready map[string]any
			if err := getJSON(p.debug+"/readyz", &ready); err != nil || ready["ready"] != true {
				t.Fatalf("readyz: %v %v", ready, err)
			}
			if streams, _ := ready["streams"].(map[string]any); streams["0"] != tc.want {
				t.Fatalf("readyz streams %v", ready["streams"])
			}
			// A second of scrapes later: still one warning for the one
			// transition (with replay, a silent verdict may come first when
			// the window ends just before a catch-up: one warning each).
			st = p.scrapesPast(t, time.Now().Add(time.Second))
			trs := p.transitions(t)
			ok := len(trs) == 1 || tc.replay && len(trs) == 2 && trs[0].State == "silent"
			for _, tr := range trs {
				ok = ok && tr.Level == "warn" && strings.Contains(tr.Reason, "--kv-events-mode bind")
			}
			if !ok || trs[len(trs)-1].State != tc.want || st.StreamState != tc.want {
				t.Fatalf("state %s; transitions %+v", st.StreamState, trs)
			}
		})
	}
}

// TestStreamBindModeLive: the same engine (its endpoint names 127.0.0.1,
// so it connects) with the sidecar in bind mode: the stream is live, and
// stays live past the window with no warning.
func TestStreamBindModeLive(t *testing.T) {
	bin := buildKvroute(t)
	p := startStreamPod(t, bin, "bind", true)
	// The engine's PUB reconnects to the bound SUB every 100 ms: the first
	// live batch comes within a few requests.
	i := 0
	testnet.Await(t, 10*time.Second, 50*time.Millisecond, func() error {
		p.request(t, 64, 100000+1000*i)
		i++
		st, err := p.state()
		if err != nil {
			return err
		}
		if st.StreamState != "live" {
			return fmt.Errorf("never live: state %s (%s)", st.StreamState, st.StreamReason)
		}
		return nil
	})
	last := time.Now()
	for j := 0; j < 5; j++ {
		p.request(t, 64, 900000+1000*j)
	}
	// Judged on evidence a full window (2.5 s) and more after the last
	// request.
	st := p.scrapesPast(t, last.Add(3*time.Second))
	if g := p.gauge(t); st.StreamState != "live" || !gaugeIs(g, map[string]float64{"live": 1, "silent": 0}) {
		t.Fatalf("state %s (%s); gauge %v", st.StreamState, st.StreamReason, g)
	}
	// One line, at info: unknown → live.
	if trs := p.transitions(t); len(trs) != 1 || trs[0].From != "unknown" || trs[0].State != "live" || trs[0].Level != "info" {
		t.Fatalf("transitions %+v", trs)
	}
	if st.Blocks["GPU"] == 0 {
		t.Fatalf("no blocks indexed: %+v", st)
	}
}

// TestEngineDownOnStream: a SIGKILLed engine makes its sidecar send a load
// report with engine_down (and the error) on its summary stream within a
// second, /debug/state and /readyz say so; when an engine answers on the
// port again, the reports say engine_down=false.
func TestEngineDownOnStream(t *testing.T) {
	bin := buildKvroute(t)
	p := startStreamPod(t, bin, "bind", true)
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := pb.NewSidecarClient(conn).WatchSummaries(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// next reads load reports until one satisfies cond; past d it cuts the
	// stream and fails.
	next := func(d time.Duration, what string, cond func(*pb.LoadReport) bool) *pb.LoadReport {
		t.Helper()
		timer := time.AfterFunc(d, cancel)
		defer timer.Stop()
		for {
			u, err := stream.Recv()
			if err != nil {
				t.Fatalf("no load report with %s within %v: %v", what, d, err)
			}
			if l := u.GetLoad(); l != nil && cond(l) {
				return l
			}
		}
	}
	up := next(10*time.Second, "the engine up", func(l *pb.LoadReport) bool { return !l.EngineDown })
	if up.StreamState == "" || up.EngineError != "" {
		t.Fatalf("report %+v", up)
	}
	if err := p.engineCmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	down := next(5*time.Second, "engine_down", func(l *pb.LoadReport) bool { return l.EngineDown })
	took := time.Since(killed)
	t.Logf("engine_down on the stream %v after SIGKILL: %s", took.Round(time.Millisecond), down.EngineError)
	if took > time.Second || !strings.Contains(down.EngineError, "connection refused") || down.StreamState == "" {
		t.Fatalf("after %v: %+v", took, down)
	}
	// Reports keep coming while it is down (the last good load, its time).
	again := next(2*time.Second, "engine_down again", func(l *pb.LoadReport) bool { return l.EngineDown })
	if again.ScrapedUnixNanos != down.ScrapedUnixNanos || down.ScrapedUnixNanos < up.ScrapedUnixNanos {
		t.Fatalf("the last good scrape moved: up %d, down %d, then %d", up.ScrapedUnixNanos, down.ScrapedUnixNanos, again.ScrapedUnixNanos)
	}
	st, err := p.state()
	if err != nil || !st.EngineDown || !strings.Contains(st.EngineError, "connection refused") {
		t.Fatalf("debug state %+v %v", st, err)
	}
	resp, err := http.Get(p.debug + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "connection refused") {
		t.Fatalf("readyz %d %s", resp.StatusCode, body)
	}
	// A new engine process on the same ports.
	p.startEngine(t, bin)
	back := next(30*time.Second, "the engine up again", func(l *pb.LoadReport) bool { return !l.EngineDown })
	if back.EngineError != "" || back.ScrapedUnixNanos <= down.ScrapedUnixNanos {
		t.Fatalf("report %+v", back)
	}
	if st, err := p.state(); err != nil || st.EngineDown {
		t.Fatalf("debug state %+v %v", st, err)
	}
}
