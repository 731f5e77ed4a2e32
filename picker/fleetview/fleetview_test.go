package fleetview_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	fleetpkg "github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/sidecar"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/metrictest"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

const capacity = 4096

type pod struct {
	engine  *enginesim.Engine
	sidecar *sidecar.Sidecar
	members *gossip.Members
}

func startPod(t testing.TB, i int, join string) *pod {
	return startPodWith(t, i, join, podOptions{gpuBlocks: 2048, capacity: capacity, gossip: true})
}

// podOptions size a test pod.
type podOptions struct {
	gpuBlocks, capacity int           // engine blocks; summary capacity
	gossip              bool          // the sidecar joins gossip
	scrape              time.Duration // the sidecar's scrape interval; 0: default
}

// startPodWith starts an engine and its sidecar as o says.
func startPodWith(t testing.TB, i int, join string, o podOptions) *pod {
	t.Helper()
	po := testpod.Options{GPUBlocks: o.gpuBlocks, MaxModelLen: 4096, Capacity: o.capacity, Scrape: o.scrape}
	if o.gossip {
		gcfg := gossip.LocalConfig(fmt.Sprintf("sidecar-%d", i))
		if join != "" {
			gcfg.Join = []string{join}
		}
		po.Gossip = &gcfg // the sidecar gossips its own gRPC address
	}
	p := testpod.Start(t, po)
	return &pod{engine: p.Engine, sidecar: p.Sidecar, members: p.Sidecar.Members()}
}

// viewConfig is the default configuration with params, re-dialling after
// retry.
// testGrace is the sidecar grace period of the tests' views: short, so a
// lost sidecar's endpoints are seen to go load-only and then leave.
const testGrace = time.Second

func viewConfig(p summary.Params, retry time.Duration) fleetview.Config {
	cfg := fleetview.DefaultConfig()
	cfg.Params, cfg.Retry = p, retry
	cfg.Health.SidecarGrace = testGrace
	return cfg
}

type picker struct {
	reg     *prometheus.Registry
	view    *fleetview.View
	members *gossip.Members
	cancel  context.CancelFunc
}

func startPicker(t *testing.T, name, join string) *picker {
	t.Helper()
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(viewConfig(summary.ForCapacity(capacity), 100*time.Millisecond), zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	gcfg := gossip.LocalConfig(name)
	gcfg.Join = []string{join}
	m, err := gossip.New(gcfg, gossip.Meta{Role: gossip.RolePicker}, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go v.FollowGossip(ctx, m)
	p := &picker{reg: reg, view: v, members: m, cancel: cancel}
	t.Cleanup(p.stop)
	return p
}

func (p *picker) stop() {
	p.cancel()
	p.view.Close()
	_ = p.members.Kill()
}

func complete(t testing.TB, e *enginesim.Engine, tokens []uint32) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"prompt": tokens, "max_tokens": 1})
	resp, err := http.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func tokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// agree waits until the view answers, for each request, the engine that
// served it with its full block count and every other endpoint with 0.
func agree(t *testing.T, v *fleetview.View, pods []*pod, reqs map[int][]uint32, timeout time.Duration) {
	t.Helper()
	testnet.Await(t, timeout, 20*time.Millisecond, func() error {
		eps := v.Endpoints()
		if len(eps) != len(pods) {
			return fmt.Errorf("views disagree: %d endpoints known", len(eps))
		}
		for i, toks := range reqs {
			chain := (&blockkey.Request{Tokens: toks}).AppendKeys(nil, "Qwen/Qwen3-0.6B", 16)
			got := v.Match(eps[0].Group, tier.GPU, chain)
			for j, p := range pods {
				want := 0
				if j == i {
					want = len(chain)
				}
				if got[p.engine.URL()] != want {
					return fmt.Errorf("views disagree: request %d: pod %d matched %d, want %d", i, j, got[p.engine.URL()], want)
				}
			}
		}
		return nil
	})
}

// TestPickersAgree: three engines with sidecars and two pickers on
// loopback, found through gossip: both pickers agree on every endpoint's
// matched lengths; a killed sidecar leaves both within 5 s; a restarted
// picker rebuilds everything from snapshots.
func TestPickersAgree(t *testing.T) {
	var pods []*pod
	for i := 0; i < 3; i++ {
		join := ""
		if i > 0 {
			join = pods[0].members.LocalAddr()
		}
		pods = append(pods, startPod(t, i, join))
	}
	seed := pods[0].members.LocalAddr()
	pickers := []*picker{startPicker(t, "picker-a", seed), startPicker(t, "picker-b", seed)}
	reqs := map[int][]uint32{0: tokens(100, 1000), 1: tokens(160, 5000), 2: tokens(64, 9000)}
	for i, toks := range reqs {
		complete(t, pods[i].engine, toks)
	}
	for _, p := range pickers {
		agree(t, p.view, pods, reqs, 15*time.Second)
	}
	families, err := pickers[0].reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if stale := metrictest.Series(families, "kvroute_picker_endpoint_staleness_seconds", nil); stale != 3 {
		t.Fatalf("staleness for %d endpoints, want 3", stale)
	}
	// Blocks stored after the snapshots arrive come as deltas, which carry
	// the event-to-routable lag.
	complete(t, pods[0].engine, tokens(32, 60000))
	for _, p := range pickers {
		testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
			if metrictest.Gathered(t, p.reg, "kvroute_picker_event_to_routable_seconds", nil) == 0 {
				return errors.New("no event-to-routable lag observed")
			}
			return nil
		})
	}
	// Kill pod 2's sidecar (its gossip member dies without leaving).
	killed := time.Now()
	_ = pods[2].members.Kill()
	t0 := time.Now()
	pods[2].sidecar.Close()
	t.Logf("sidecar Close took %v", time.Since(t0).Round(10*time.Millisecond))
	// Its engine still answers: both pickers route it by load only within
	// 5 s, then drop it when the grace period ends.
	lost := pods[2].engine.URL()
	for _, p := range pickers {
		testnet.Await(t, 5*time.Second-time.Since(killed), 10*time.Millisecond, func() error {
			for _, e := range p.view.Endpoints() {
				if e.URL == lost {
					if h := p.view.Health(&e); h.State != fleetpkg.LoadOnly || !strings.Contains(h.Reason, "sidecar is lost") {
						return fmt.Errorf("the dead sidecar's engine is not yet routed by load only: %+v", h)
					}
					return nil
				}
			}
			return errors.New("the dead sidecar's engine is not listed")
		})
	}
	t.Logf("dead sidecar's engine load-only after %v", time.Since(killed).Round(10*time.Millisecond))
	for _, p := range pickers {
		testnet.Await(t, time.Until(killed.Add(5*time.Second+testGrace)), 20*time.Millisecond, func() error {
			if n := len(p.view.Endpoints()); n != 2 {
				return fmt.Errorf("dead sidecar's endpoints still known 5 s + the grace after: %d endpoints", n)
			}
			return nil
		})
	}
	t.Logf("dead sidecar's endpoints dropped after %v", time.Since(killed).Round(10*time.Millisecond))
	live := pods[:2]
	delete(reqs, 2)
	// A restarted picker rebuilds from snapshots.
	pickers[1].stop()
	fresh := startPicker(t, "picker-b2", seed)
	agree(t, fresh.view, live, reqs, 15*time.Second)
}

// TestPartitionHeals: a picker whose gossip transport drops everything
// loses the sidecars, and finds them again (and agrees again) once the
// partition heals.
func TestPartitionHeals(t *testing.T) {
	var pods []*pod
	for i := 0; i < 2; i++ {
		join := ""
		if i > 0 {
			join = pods[0].members.LocalAddr()
		}
		pods = append(pods, startPod(t, i, join))
	}
	tr, err := gossip.NewPartitionable("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	v, err := fleetview.New(viewConfig(summary.ForCapacity(capacity), 100*time.Millisecond), zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	gcfg := gossip.LocalConfig("partitioned-picker")
	gcfg.Transport = tr
	gcfg.Join = []string{pods[0].members.LocalAddr()}
	m, err := gossip.New(gcfg, gossip.Meta{Role: gossip.RolePicker}, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Kill()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.FollowGossip(ctx, m)
	reqs := map[int][]uint32{0: tokens(64, 100), 1: tokens(96, 700)}
	for i, toks := range reqs {
		complete(t, pods[i].engine, toks)
	}
	agree(t, v, pods, reqs, 15*time.Second)
	tr.Cut()
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		if n := len(v.Endpoints()); n != 0 {
			return fmt.Errorf("partitioned picker still lists %d endpoints", n)
		}
		return nil
	})
	complete(t, pods[0].engine, tokens(48, 3000)) // the fleet moves on meanwhile
	reqs[0] = tokens(48, 3000)
	tr.Heal()
	agree(t, v, pods, reqs, 20*time.Second)
}

// sentUpdates reads how many updates of a kind (snapshot, delta, load) a
// sidecar has sent its watchers.
func sentUpdates(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	t.Helper()
	return metrictest.Gathered(t, reg, "kvroute_sidecar_stream_updates_total", map[string]string{"kind": kind})
}

// TestSecondClaimantIsIgnored: two sidecars following one engine both list
// its endpoint; the view keeps the first owner, counts the conflict, and
// does not resynchronise over and over.
func TestSecondClaimantIsIgnored(t *testing.T) {
	first := startPod(t, 0, "")
	e := first.engine
	scfg := sidecar.DefaultConfig()
	scfg.EngineURL, scfg.KVEvents, scfg.Replay = e.URL(), e.EventsEndpoint(), e.ReplayEndpoint()
	scfg.AdminListen, scfg.GRPCListen, scfg.Capacity = "127.0.0.1:0", "127.0.0.1:0", capacity
	scfg.StartupTimeout = 10 * time.Second
	second, err := sidecar.Start(context.Background(), scfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(viewConfig(summary.ForCapacity(capacity), 50*time.Millisecond), zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch(first.sidecar.GRPCAddr())
	reqs := map[int][]uint32{0: tokens(80, 700)}
	complete(t, e, reqs[0])
	agree(t, v, []*pod{first}, reqs, 15*time.Second)
	v.Watch(second.GRPCAddr())
	complete(t, e, tokens(48, 9000))
	reqs[0] = tokens(48, 9000)
	agree(t, v, []*pod{first}, reqs, 15*time.Second)
	// Let the second stream try its luck: its claim is refused (a
	// conflict), and the stream then lives through several of the
	// endpoint's load reports, each ignored, which must not resynchronise
	// it over and over.
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if metrictest.Gathered(t, reg, "kvroute_picker_endpoint_conflicts_total", nil) < 1 {
			return errors.New("the second claim is not counted as a conflict")
		}
		return nil
	})
	loads := sentUpdates(t, second.Registry(), "load")
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := sentUpdates(t, second.Registry(), "load"); n < loads+3 {
			return fmt.Errorf("the second sidecar sent %v load reports since, want 3", n-loads)
		}
		return nil
	})
	eps := v.Endpoints()
	if len(eps) != 1 || eps[0].Sidecar != first.sidecar.GRPCAddr() {
		t.Fatalf("endpoints %+v", eps)
	}
	conflicts := metrictest.Gathered(t, reg, "kvroute_picker_endpoint_conflicts_total", nil)
	resyncs := metrictest.Gathered(t, reg, "kvroute_picker_summary_resyncs_total", nil)
	if conflicts == 0 || resyncs > 2 {
		t.Fatalf("conflicts %v resyncs %v", conflicts, resyncs)
	}
	// The refused claim is listed (for /debug/endpoints and verify), and
	// forgotten with its sidecar.
	if r := v.Refused(); len(r) != 1 || r[0].Reason != "other_owner" || r[0].Sidecar != second.GRPCAddr() || r[0].Info.Endpoint != e.URL() {
		t.Fatalf("refused %+v", r)
	}
	v.Forget(second.GRPCAddr())
	if r := v.Refused(); len(r) != 0 {
		t.Fatalf("refused after forgetting the sidecar: %+v", r)
	}
}

// TestOtherSummarySizeIsRefused: a sidecar sized for another capacity is
// refused, and listed as such.
func TestOtherSummarySizeIsRefused(t *testing.T) {
	p := startPodWith(t, 0, "", podOptions{gpuBlocks: 2048, capacity: capacity / 2})
	v, err := fleetview.New(viewConfig(summary.ForCapacity(capacity), 50*time.Millisecond), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch(p.sidecar.GRPCAddr())
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if len(v.Refused()) == 0 {
			return errors.New("the sidecar sized for another capacity is not refused")
		}
		return nil
	})
	r := v.Refused()
	if len(r) != 1 || r[0].Reason != "summary_params" || len(v.Endpoints()) != 0 {
		t.Fatalf("refused %+v, endpoints %+v", r, v.Endpoints())
	}
}
