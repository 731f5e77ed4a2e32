package fleetview_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// offer is an InfoResponse listing the given endpoint URLs, one model.
func offer(p summary.Params, urls ...string) *pb.InfoResponse {
	info := &pb.InfoResponse{}
	for _, url := range urls {
		info.Endpoints = append(info.Endpoints, &pb.EndpointInfo{Endpoint: url, Model: "m", BlockSize: 16,
			KeyFormat: blockkey.FormatV1, SummaryParams: p.String(), Epoch: 1})
	}
	return info
}

// restartOnce is a script whose first stream ends at once (an update of
// an unknown tier for url, malformed) and whose next ones hold: the view
// asks the sidecar for its endpoints a second time.
func restartOnce(url string) [][]*pb.SummaryUpdate {
	return [][]*pb.SummaryUpdate{{{Endpoint: url, Tier: "NVME", Epoch: 1, Feed: 1,
		Body: &pb.SummaryUpdate_Delta{Delta: &pb.Delta{Seq: 1}}}}, {}}
}

// seriesValue reads the one series of a gauge or counter vector whose
// reason is reason, failing the test when there is none.
func seriesValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"reason": reason}
	if n := metrictest.Series(families, name, labels); n != 1 {
		t.Fatalf("%d series %s{reason=%q}, want 1", n, name, reason)
	}
	return metrictest.Sum(families, name, labels)
}

func refusedURLs(v *fleetview.View) map[string]string {
	out := map[string]string{}
	for _, r := range v.Refused() {
		out[r.Info.Endpoint] = r.Reason
	}
	return out
}

// TestRemoteEndpointRefused: a sidecar on 127.0.0.1 advertising, beside
// its own engines, one on another host and one with no host has those two
// refused: never handed to the fleet state (not routed), listed with the
// sidecar, the reason, since when and why, counted, logged once — not
// again when its stream restarts and it lists them anew — and gone with
// the sidecar.
func TestRemoteEndpointRefused(t *testing.T) {
	p := summary.ForCapacity(capacity)
	const honest, mapped, remote, bad = "http://127.0.0.1:8000", "http://[::ffff:127.0.0.1]:8001", "http://192.0.2.10:8000", "tcp://127.0.0.1:8002"
	s := &scriptedSidecar{info: offer(p, honest, mapped, remote, bad), scripts: restartOnce(honest)}
	addr := serveScripted(t, s)
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(viewConfig(p, 20*time.Millisecond), zap.New(core), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	start := time.Now()
	v.Watch(addr)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !(s.Calls() >= 2) {
			return errors.New("not yet the stream restarted")
		}
		return nil
	})
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !(len(v.Endpoints()) == 2) {
			return errors.New("not yet the endpoints re-registered")
		}
		return nil
	})
	eps := v.Endpoints()
	if eps[0].URL != honest || eps[1].URL != mapped {
		t.Fatalf("endpoints %v, %v", eps[0].URL, eps[1].URL)
	}
	if got := refusedURLs(v); len(got) != 2 || got[remote] != "remote_endpoint" || got[bad] != "malformed_endpoint" {
		t.Fatalf("refused %v", got)
	}
	for _, r := range v.Refused() {
		since, detail, ok := v.Untrusted(r)
		if !ok || r.Sidecar != addr || since.Before(start) || since.After(time.Now()) || detail == "" {
			t.Fatalf("%s: sidecar %s, since %v, detail %q, ok %v", r.Info.Endpoint, r.Sidecar, since, detail, ok)
		}
		if r.Info.Endpoint == remote && (!strings.Contains(detail, "192.0.2.10") || !strings.Contains(detail, "127.0.0.1")) {
			t.Fatalf("detail %q does not name both hosts", detail)
		}
	}
	for reason, want := range map[string]float64{"remote_endpoint": 1, "malformed_endpoint": 1, "unresolved_endpoint": 0} {
		if n := seriesValue(t, reg, "kvroute_picker_endpoints_untrusted", reason); n != want {
			t.Errorf("untrusted{%s} = %v, want %v", reason, n, want)
		}
	}
	// Counted and logged once each, though listed by two calls of Info.
	if n := seriesValue(t, reg, "kvroute_picker_trust_refusals_total", "remote_endpoint"); n != 1 {
		t.Errorf("trust_refusals_total{remote_endpoint} = %v", n)
	}
	if n := metrictest.Gathered(t, reg, "kvroute_picker_endpoints_refused_total", nil); n != 2 {
		t.Errorf("refused_total = %v", n)
	}
	lines := logs.FilterMessage("endpoint refused: not trusted from this sidecar")
	if lines.Len() != 2 {
		t.Fatalf("%d refusal lines, want one per endpoint", lines.Len())
	}
	if f := lines.FilterField(zap.String("endpoint", remote)).All(); len(f) != 1 || f[0].ContextMap()["reason"] != "remote_endpoint" {
		t.Fatalf("the remote endpoint's line: %+v", f)
	}
	v.Forget(addr)
	if r := v.Refused(); len(r) != 0 {
		t.Fatalf("after Forget: refused %+v", r)
	}
	if n := seriesValue(t, reg, "kvroute_picker_endpoints_untrusted", "remote_endpoint"); n != 0 {
		t.Fatalf("after Forget: untrusted %v", n)
	}
}

// TestAllowRemoteEndpoints: a network given in AllowRemote takes the
// endpoints in it from any sidecar, and only those.
func TestAllowRemoteEndpoints(t *testing.T) {
	p := summary.ForCapacity(capacity)
	const inside, outside = "http://192.0.2.10:8000", "http://198.51.100.7:8000"
	addr := serveScripted(t, &scriptedSidecar{info: offer(p, inside, outside), scripts: [][]*pb.SummaryUpdate{{}}})
	cfg := viewConfig(p, 20*time.Millisecond)
	cfg.AllowRemote = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	v, err := fleetview.New(cfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch(addr)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !(len(v.Endpoints()) == 1 && len(v.Refused()) == 1) {
			return errors.New("not yet the allowed endpoint taken")
		}
		return nil
	})
	if e := v.Endpoints()[0]; e.URL != inside {
		t.Fatalf("took %s", e.URL)
	}
	if got := refusedURLs(v); got[outside] != "remote_endpoint" {
		t.Fatalf("refused %v", got)
	}
}

// TestUntrustedSidecarIsNotStreamed: a sidecar none of whose endpoints is
// trusted has its summaries never asked for (no WatchSummaries call),
// while an honest one beside it is streamed.
func TestUntrustedSidecarIsNotStreamed(t *testing.T) {
	p := summary.ForCapacity(capacity)
	rogue := &scriptedSidecar{info: offer(p, "http://192.0.2.10:8000"), scripts: [][]*pb.SummaryUpdate{{}}}
	honest := &scriptedSidecar{info: offer(p, "http://127.0.0.1:8000"), scripts: [][]*pb.SummaryUpdate{{}}}
	rogueAddr, honestAddr := serveScripted(t, rogue), serveScripted(t, honest)
	v, err := fleetview.New(viewConfig(p, 20*time.Millisecond), zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch(rogueAddr)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !(len(v.Refused()) == 1) {
			return errors.New("not yet the rogue's endpoint refused")
		}
		return nil
	})
	v.Watch(honestAddr)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !(honest.Calls() == 1 && len(v.Endpoints()) == 1) {
			return errors.New("not yet the honest sidecar streamed")
		}
		return nil
	})
	if n := rogue.Calls(); n != 0 {
		t.Fatalf("the untrusted sidecar was asked for its summaries %d times", n)
	}
	if e := v.Endpoints()[0]; e.URL != "http://127.0.0.1:8000" || e.Sidecar != honestAddr {
		t.Fatalf("endpoint %s of %s", e.URL, e.Sidecar)
	}
}

// fakeLookup answers names from a table, counting calls; "slow" waits
// for its context.
type fakeLookup struct {
	mu    sync.Mutex
	calls map[string]int
	table map[string][]netip.Addr
}

func (f *fakeLookup) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	f.calls[host]++
	f.mu.Unlock()
	if host == "slow" {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if a, ok := f.table[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (f *fakeLookup) count(host string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[host]
}

// TestTrustLookups: endpoint names are resolved (each once, the answer and
// the failure kept across a stream restart, a slow lookup cut at the
// timeout) and judged by their addresses; localhost needs no lookup.
func TestTrustLookups(t *testing.T) {
	p := summary.ForCapacity(capacity)
	f := &fakeLookup{calls: map[string]int{}, table: map[string][]netip.Addr{
		"engine-a":  {netip.MustParseAddr("127.0.0.1")},
		"elsewhere": {netip.MustParseAddr("192.0.2.10")},
	}}
	urls := []string{"http://engine-a:8000", "http://ENGINE-A.:8001", "http://localhost:8002", "http://elsewhere:8000", "http://gone:8000", "http://slow:8000"}
	s := &scriptedSidecar{info: offer(p, urls...), scripts: restartOnce(urls[0])}
	addr := serveScripted(t, s)
	cfg := viewConfig(p, 20*time.Millisecond)
	cfg.Lookup, cfg.LookupTimeout = f.lookup, 100*time.Millisecond
	v, err := fleetview.New(cfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch(addr)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !(s.Calls() >= 2) {
			return errors.New("not yet the stream restarted")
		}
		return nil
	})
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !(len(v.Endpoints()) == 3 && len(v.Refused()) == 3) {
			return errors.New("not yet the named endpoints judged")
		}
		return nil
	})
	want := map[string]string{"http://elsewhere:8000": "remote_endpoint", "http://gone:8000": "unresolved_endpoint", "http://slow:8000": "unresolved_endpoint"}
	got := refusedURLs(v)
	for url, reason := range want {
		if got[url] != reason {
			t.Errorf("%s: %q, want %s", url, got[url], reason)
		}
	}
	for _, r := range v.Refused() {
		if _, detail, _ := v.Untrusted(r); r.Info.Endpoint == "http://slow:8000" && !strings.Contains(detail, "deadline") {
			t.Errorf("the slow lookup's detail %q", detail)
		}
	}
	for _, name := range []string{"engine-a", "elsewhere", "gone", "slow"} {
		if n := f.count(name); n != 1 {
			t.Errorf("%s looked up %d times, want once (kept across the restart)", name, n)
		}
	}
	if n := f.count("localhost"); n != 0 {
		t.Errorf("localhost looked up %d times", n)
	}
	if n := f.count("127.0.0.1"); n != 0 {
		t.Errorf("the sidecar's IP looked up %d times", n)
	}
}

// TestSidecarDialledByName: a sidecar the picker dials by a name has its
// endpoints judged against what the name resolves to; localhost is
// loopback without a lookup.
func TestSidecarDialledByName(t *testing.T) {
	p := summary.ForCapacity(capacity)
	addr := serveScripted(t, &scriptedSidecar{info: offer(p, "http://127.0.0.1:8000"), scripts: [][]*pb.SummaryUpdate{{}}})
	_, port, _ := net.SplitHostPort(addr)
	var lookups atomic.Int64
	cfg := viewConfig(p, 20*time.Millisecond)
	cfg.Lookup = func(context.Context, string) ([]netip.Addr, error) {
		lookups.Add(1)
		return nil, errors.New("no lookup wanted")
	}
	v, err := fleetview.New(cfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch("localhost:" + port)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !(len(v.Endpoints()) == 1) {
			return errors.New("not yet the endpoint taken")
		}
		return nil
	})
	if len(v.Refused()) != 0 || lookups.Load() != 0 {
		t.Fatalf("refused %+v, %d lookups", v.Refused(), lookups.Load())
	}
}
