package collect

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/internal/verify"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/fleetview"
)

// debugFleet is a picker's fleet as /debug/endpoints shows it: endpoints,
// refusals (with the trust check's notes) and failing sidecars, fixed
// values rather than streams.
type debugFleet struct {
	eps       []fleet.Endpoint
	refused   []fleetview.Refused
	untrusted map[string]time.Time // refused endpoint → since when the trust check refuses it
	failing   []fleetview.SidecarFailure
}

func (f *debugFleet) Endpoints() []fleet.Endpoint { return f.eps }
func (f *debugFleet) GroupEndpoints(group string) []fleet.Endpoint {
	var out []fleet.Endpoint
	for _, e := range f.eps {
		if e.Group == group {
			out = append(out, e)
		}
	}
	return out
}
func (f *debugFleet) Match(string, tier.Tier, []blockkey.Key) map[string]int { return nil }
func (f *debugFleet) ReportFailure(string, string)                           {}
func (f *debugFleet) Models() []string                                       { return nil }
func (f *debugFleet) Refused() []fleetview.Refused                           { return f.refused }
func (f *debugFleet) Failing() []fleetview.SidecarFailure                    { return f.failing }
func (f *debugFleet) Untrusted(r fleetview.Refused) (time.Time, string, bool) {
	since, ok := f.untrusted[r.Info.Endpoint]
	return since, "the endpoint's host is not its sidecar's", ok
}

// TestDebugEndpointsRoundTrip: what the picker writes on /debug/endpoints
// is what verify reads, field by field. A picker over a fleet that sets
// every field of the document (debugapi.Unset) answers with JSON that
// decodes strictly into debugapi.Document and encodes back to the same
// bytes; collect reads it into verify's Facts with every value as the
// fleet holds it, and Judge uses them. A JSON name the picker writes and
// verify reads otherwise fails here.
func TestDebugEndpointsRoundTrip(t *testing.T) {
	now := time.Now()
	id := func(url, model string) fleet.Identity {
		return fleet.Identity{Endpoint: url, Model: model, BlockSize: 16, NumGPUBlocks: 4096, HashAlgo: "sha256_cbor", KeyFormat: "kvroute-xxh3-v1",
			SummaryParams: "m=65536", TokenizerFingerprint: "tok"}
	}
	full := fleet.Endpoint{URL: "http://10.0.0.1:8000", Sidecar: "10.0.0.1:9090", Group: "g1", Info: id("http://10.0.0.1:8000", "m"),
		Load:       fleet.Load{Waiting: 2, Running: 5, KVCacheUsage: 0.25, EngineDown: true, EngineError: "connection refused"},
		LastUpdate: now.Add(-time.Second), StreamState: "partial", StreamReason: "lost events", Lag: 18 * time.Millisecond}
	full.Info.Rank, full.Info.Epoch, full.Info.Partial, full.Info.DebugURL = 1, 3, true, "http://10.0.0.1:9091"
	full.Info.KVSource = "10.0.0.1:5711"
	fresh := fleet.Endpoint{URL: "http://10.0.0.2:8000", Sidecar: "10.0.0.2:9090", Group: "g1", Info: id("http://10.0.0.2:8000", "m"), Since: now}
	remote := fleetview.Refused{Info: id("http://203.0.113.7:8000", "m"), Sidecar: "10.0.0.3:9090", Reason: "remote_endpoint"}
	other := fleetview.Refused{Info: id("http://10.0.0.4:8000", "n"), Sidecar: "10.0.0.4:9090", Reason: "group_full"}
	fl := &debugFleet{eps: []fleet.Endpoint{full, fresh}, refused: []fleetview.Refused{remote, other},
		untrusted: map[string]time.Time{remote.Info.Endpoint: time.Date(2026, 1, 2, 3, 4, 5, 5e8, time.FixedZone("CET", 3600))},
		failing:   []fleetview.SidecarFailure{{Sidecar: "10.0.0.5:9090", Reason: "tls", Error: "x509: unknown authority", Since: now.Add(-2 * time.Second)}}}
	pcfg := picker.DefaultConfig()
	pcfg.EnginePriority = true
	r, err := picker.NewRouter(pcfg, fl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	lastBatch, peerLag := 0.4, 0.002
	peers := []debugapi.PeerPicker{{Address: "10.0.0.7:9000", Awaiting: 2, Error: "", Expired: 1, Instance: "9f86d081884c7d65", LagSeconds: &peerLag,
		LastBatchSeconds: &lastBatch, Live: 5, Received: 40, State: debugapi.PeerFollowing}}
	srv := httptest.NewServer(r.AdminHandler(picker.HandlerOptions{GossipInsecure: func() bool { return true },
		Pickers: func(p *debugapi.Picker) { p.SharesBookings, p.Instance, p.Pickers = true, "0a1b2c3d4e5f6071", peers },
		ExtProc: &debugapi.ExtProc{Address: "[::]:9002", TLS: true, ClientCert: true}}))
	t.Cleanup(srv.Close)

	// The bytes: all of them the document's, in its order.
	raw := get(t, srv.URL+debugapi.Path)
	var strict debugapi.Document
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&strict); err != nil {
		t.Fatalf("the picker writes what the document does not hold: %v\n%s", err, raw)
	}
	if again, err := json.Marshal(strict); err != nil || !bytes.Equal(bytes.TrimSpace(raw), again) {
		t.Errorf("the picker wrote\n%s\nthe document encodes\n%s", raw, again)
	}
	// The TTFT model's fields are not verify's to read (the picker's
	// TestPredictedTTFTIsLearnedAndShown covers them); a fixed fleet has
	// taught the model nothing.
	unset := slices.DeleteFunc(debugapi.Unset(strict), func(name string) bool {
		return strings.HasPrefix(name, "ttft_models[].") || name == "endpoints[].ttft" || name == "picker.pickers[].error" || // a stream up has none
			name == "picker.engine_priority.refused_by" // no engine of a fixed fleet refused (TestEnginePriorityRefused fills it)
	})
	if len(unset) > 0 {
		t.Errorf("the fleet leaves fields unset, which this test would not compare: %v", unset)
	}

	// The values, as collect reads them into verify's Facts.
	cfg := DefaultConfig()
	cfg.Picker, cfg.Admin = srv.URL, srv.URL
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var f verify.Facts
	ep, err := c.readPicker(context.Background(), &f)
	if err != nil {
		t.Fatal(err)
	}
	if ep == nil || *ep != (debugapi.ExtProc{Address: "[::]:9002", TLS: true, ClientCert: true}) {
		t.Errorf("the endpoint picker read %+v", ep)
	}
	if len(f.Fleet) != 2 || len(f.Refused) != 2 {
		t.Fatalf("read %+v", f)
	}
	// Measured at the picker's now: within the test's run. (Verify does
	// not read the failing sidecars: compared as decoded.)
	e, s := &f.Fleet[0], &strict.SidecarsFailing[0]
	if e.StaleSecs < 1 || e.StaleSecs > 60 || s.SecondsFailing < 2 || s.SecondsFailing > 60 {
		t.Errorf("seconds since update %v, failing %v", e.StaleSecs, s.SecondsFailing)
	}
	for _, e := range f.Fleet {
		if len(e.EndpointID) != 16 || strings.Trim(e.EndpointID, "0123456789abcdef") != "" || e.EndpointID == f.Fleet[1].EndpointID && e.Endpoint != f.Fleet[1].Endpoint {
			t.Errorf("%s: endpoint_id %q", e.Endpoint, e.EndpointID)
		}
	}
	e.StaleSecs, s.SecondsFailing, f.Fleet[0].EndpointID, f.Fleet[1].EndpointID = 0, 0, "", ""
	lag := 0.018
	want := []debugapi.Endpoint{{Endpoint: full.URL, Sidecar: full.Sidecar, SidecarDebug: "http://10.0.0.1:9091", Group: "g1", Model: "m", Rank: 1,
		BlockSize: 16, NumGPUBlocks: 4096, HashAlgo: "sha256_cbor", KeyFormat: "kvroute-xxh3-v1", SummaryParams: "m=65536", TokenizerFingerprint: "tok",
		Epoch: 3, Partial: true, KVSource: "10.0.0.1:5711", Waiting: 2, Running: 5, KVUsage: 0.25, State: "down", StateReason: "the sidecar cannot reach the engine: connection refused",
		StreamState: "partial", StreamReason: "lost events", EngineDown: true, EngineError: "connection refused", LagSeconds: &lag,
	}, {Endpoint: fresh.URL, Sidecar: fresh.Sidecar, Group: "g1", Model: "m", BlockSize: 16, NumGPUBlocks: 4096, HashAlgo: "sha256_cbor",
		KeyFormat: "kvroute-xxh3-v1", SummaryParams: "m=65536", TokenizerFingerprint: "tok", NeverUpdated: true, State: "cached"}}
	if !reflect.DeepEqual(f.Fleet, want) {
		t.Errorf("endpoints:\n got %+v\nwant %+v", f.Fleet, want)
	}
	wantRefused := []debugapi.Refusal{{Endpoint: remote.Info.Endpoint, Sidecar: remote.Sidecar, Reason: "remote_endpoint", Model: "m", BlockSize: 16,
		SummaryParams: "m=65536", TokenizerFingerprint: "tok", Since: "2026-01-02T02:04:05.5Z", Detail: "the endpoint's host is not its sidecar's"},
		{Endpoint: other.Info.Endpoint, Sidecar: other.Sidecar, Reason: "group_full", Model: "n", BlockSize: 16, SummaryParams: "m=65536", TokenizerFingerprint: "tok"}}
	if !reflect.DeepEqual(f.Refused, wantRefused) {
		t.Errorf("refused:\n got %+v\nwant %+v", f.Refused, wantRefused)
	}
	if s := strict.SidecarsFailing[0]; s != (debugapi.SidecarFailing{Sidecar: "10.0.0.5:9090", Reason: "tls", Error: "x509: unknown authority"}) || !f.Self.GossipInsecure {
		t.Errorf("failing %+v, the picker's gossip insecure %v", s, f.Self.GossipInsecure)
	}
	if !f.Self.SharesBookings || !reflect.DeepEqual(f.Self.Pickers, peers) {
		t.Errorf("the pickers followed: shares %v, %+v", f.Self.SharesBookings, f.Self.Pickers)
	}

	// And verify judges them: the picker's state and reason, the trust
	// check's sentence and since when, its insecure gossip, the lag.
	rep := verify.Judge(f, verify.DefaultLimits())
	for _, want := range []string{
		"picker state " + full.URL + ": down, sent nothing: the sidecar cannot reach the engine: connection refused",
		"routable " + remote.Info.Endpoint + ": the picker refused the endpoint: remote_endpoint: the endpoint's host is not its sidecar's (since 2026-01-02T02:04:05.5Z)",
		"picker gossip encrypted : the picker gossips without a keyring off loopback (--gossip-insecure)",
		"sidecar fresh " + fresh.URL + ": the sidecar has sent nothing for this endpoint yet",
	} {
		found := false
		for _, c := range verify.Failed(rep.Checks) {
			found = found || c.Name+" "+c.Endpoint+": "+c.Detail == want
		}
		if !found {
			t.Errorf("no failed check %q in %+v", want, rep.Checks)
		}
	}
	if len(rep.Fleet) != 2 || rep.Fleet[0].LagSecs == nil || *rep.Fleet[0].LagSecs != lag || rep.Fleet[1].LagSecs != nil ||
		rep.Fleet[0].KVSource != "10.0.0.1:5711" || rep.Fleet[1].KVSource != "" {
		t.Errorf("the report's endpoints: %+v", rep.Fleet)
	}
	kv := false
	for _, c := range rep.Checks {
		kv = kv || c.Name == "kv sources" && c.Endpoint == "m" && c.OK && c.Figure == "1/2"
	}
	if !kv {
		t.Errorf("no kv sources check of model m at 1/2 in %+v", rep.Checks)
	}
	// With a model asked for, its endpoints and refusals only.
	cfg.Model = "n"
	cn, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cn.Close)
	var only verify.Facts
	if _, err := cn.readPicker(context.Background(), &only); err != nil {
		t.Fatal(err)
	}
	if len(only.Fleet) != 0 || len(only.Refused) != 1 || only.Refused[0].Endpoint != other.Info.Endpoint || !only.Self.GossipInsecure {
		t.Errorf("model n: %+v", only)
	}
}

// TestDebugEndpointsEmpty: a picker that knows nothing, over a fleet with
// no diagnostics, writes every list as [] (never null).
func TestDebugEndpointsEmpty(t *testing.T) {
	r, err := picker.NewRouter(picker.DefaultConfig(), struct{ picker.Fleet }{&debugFleet{}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	srv := httptest.NewServer(r.AdminHandler(picker.HandlerOptions{}))
	t.Cleanup(srv.Close)
	const want = `{"endpoints":[],"picker":{"gossip_insecure":false,"shares_bookings":false},"refused":[],"sidecars_failing":[],"ttft_models":[]}`
	if got := get(t, srv.URL+debugapi.Path); string(bytes.TrimSpace(got)) != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// get is the body of a GET of url, which must answer 200.
func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return b
}
