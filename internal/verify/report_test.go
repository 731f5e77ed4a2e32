package verify

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// fleetFacts is a two-endpoint fleet of model a where the second endpoint
// runs another chat template, with one refused endpoint.
func fleetFacts() Facts {
	e1, e2 := healthy(1, "a"), healthy(2, "a")
	e1.SidecarDebug, e2.SidecarDebug = "http://10.0.0.1:9091", "http://10.0.0.2:9091"
	// The first as a picker with endpoint states reports it, the second as
	// one without.
	lag := 0.018
	e1.Group, e1.State, e1.StateReason, e1.StreamState, e1.StreamReason, e1.LagSeconds = "g1", "cached", "live events", "live", "live batches", &lag
	e1.KVSource = "10.0.0.1:5710" // the second runs no P2P tier
	// What the picker reports and verify does not: not in the report.
	e1.EndpointID, e1.Epoch, e1.Waiting, e1.Running, e1.KVUsage = "0123456789abcdef", 3, 1, 2, 0.5
	sidecar := func(e debugapi.Endpoint) EndpointFacts {
		return EndpointFacts{Sidecar: SidecarFacts{Endpoint: e.Endpoint, DebugURL: e.SidecarDebug, Follows: []string{e.Endpoint}},
			Details: DetailsFacts{Endpoint: e.Endpoint, PromptTokens: 130, CachedTokens: 128, Details: true},
			Stream:  StreamFacts{Endpoint: e.Endpoint, DebugURL: e.SidecarDebug, Found: true, Reported: true, State: StreamLive, Served: true}}
	}
	keys := []string{"0011223344556677", "8899aabbccddeeff"}
	tokens := func(e debugapi.Endpoint, engine []string) TokenFacts {
		return TokenFacts{Probe: "chat", Endpoint: e.Endpoint, Via: "chat/completions render", Tokens: 40, EngineKeys: engine, PickerKeys: keys}
	}
	return Facts{
		Picker:    "http://picker:8080",
		Self:      PickerFacts{PublicAdminStatus: 404},
		Fleet:     []debugapi.Endpoint{e1, e2},
		Refused:   []debugapi.Refusal{{Endpoint: "http://10.0.0.3:8000", Sidecar: "10.0.0.3:9090", Reason: "summary_params", Model: "a", SummaryParams: "m=1"}},
		Endpoints: []EndpointFacts{sidecar(e1), sidecar(e2)},
		Probes: []ProbeFacts{{
			Result: ProbeResult{Name: "chat", Model: "a", FirstEndpoint: e1.Endpoint, SecondEndpoint: e1.Endpoint, PromptTokens: 40,
				BlockSize: 16, Predicted: 32, EngineCached: 32, Keys: 2, KeysIndexed: 2},
			Tokens: []TokenFacts{tokens(e1, keys), tokens(e2, []string{"ffffffffffffffff", "eeeeeeeeeeeeeeee"})},
		}},
		Lags: []LagResult{
			{Model: "a", Endpoint: e1.Endpoint, PromptTokens: 40, BlockSize: 16, FullTokens: 32, Predicted: true, LagSecs: 0.021, MostPredicted: 32, WaitedSecs: 0.03, Polls: 2},
			{Model: "a", Endpoint: e2.Endpoint, PromptTokens: 40, BlockSize: 16, FullTokens: 32, Predicted: true, LagSecs: 0.034, MostPredicted: 32, WaitedSecs: 0.04, Polls: 3},
		},
	}
}

// TestJudge: the checks come in their order — identity and freshness by
// endpoint, refusals, each endpoint's sidecar, stream and details, then
// each probe's checks and its token checks, then the lag probes — and OK
// is false on one failure.
func TestJudge(t *testing.T) {
	f := fleetFacts()
	r := Judge(f, DefaultLimits())
	var names []string
	for _, c := range r.Checks {
		names = append(names, c.Name)
	}
	identity := strings.Repeat("identity block_size,identity hash_algo,identity key_format,identity summary_params,identity tokenizer_fingerprint,sidecar fresh,picker state,", 2)
	want := identity + "picker gossip encrypted,picker admin private,pickers agree,routable,kv sources," + strings.Repeat("sidecar reachable,gossip encrypted,sidecar stream,engine reports cached tokens,", 2) +
		"probe chat same endpoint,probe chat prediction,probe chat keys on sidecar,probe chat other salt,probe chat tokens,probe chat tokens," +
		"probe lag,probe lag"
	if got := strings.Join(names, ","); got != want {
		t.Fatalf("checks\n %s\nwant\n %s", got, want)
	}
	if got := failures(r.Checks); strings.Join(got, "|") != "http://10.0.0.3:8000 routable|http://10.0.0.2:8000 probe chat tokens" {
		t.Fatalf("failed %q", got)
	}
	if r.OK || r.Picker != f.Picker || len(r.Groups) != 1 || len(r.Probes) != 1 || len(r.Lags) != 2 || len(r.Fleet) != 2 {
		t.Fatalf("%+v", r)
	}
	// Without the refused endpoint and the odd template, everything passes.
	f.Refused, f.Probes[0].Tokens = nil, f.Probes[0].Tokens[:1]
	if r := Judge(f, DefaultLimits()); !r.OK || Summary(r.Checks) != "33 checks, 33 passed, 0 failed" {
		t.Fatalf("%v: %s %q", r.OK, Summary(r.Checks), failures(r.Checks))
	}
	// The limits are Judge's: a tighter --max-lag fails the slower
	// endpoint, a silent stream fails its sidecar stream.
	f.Endpoints[1].Stream.State, f.Endpoints[1].Stream.Reason = StreamSilent, "use --kv-events-mode bind"
	lim := DefaultLimits()
	lim.MaxLag = 30 * time.Millisecond
	r = Judge(f, lim)
	if got := failures(r.Checks); strings.Join(got, "|") != "http://10.0.0.2:8000 sidecar stream|http://10.0.0.2:8000 probe lag" {
		t.Fatalf("failed %q", got)
	}
	// A saturated model fails admission; one with waiters only passes.
	f.Endpoints[1].Stream.State, f.Endpoints[1].Stream.Reason = StreamLive, ""
	f.Admission = []Admission{{Model: "m1", Saturated: true, Waiting: 12}, {Model: "m2", Waiting: 1}}
	r = Judge(f, DefaultLimits())
	if got := failures(r.Checks); strings.Join(got, "|") != "m1 admission" {
		t.Fatalf("failed %q", got)
	}
	if c := JudgeAdmission(f.Admission[0]); !strings.Contains(c.Detail, "12 requests wait") || !strings.Contains(c.Detail, "429") {
		t.Fatalf("detail %q", c.Detail)
	}
}

// TestReportJSON pins kvroute verify --json: its field names and order.
func TestReportJSON(t *testing.T) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(Judge(fleetFacts(), DefaultLimits())); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "report.golden.json")
	if *update {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Fatalf("the report's JSON changed (go test -update rewrites %s if meant):\n%s", golden, b.Bytes())
	}
}

func TestGroupsAreConsistencys(t *testing.T) {
	e := []debugapi.Endpoint{healthy(2, "b"), healthy(1, "a")}
	g := Groups(e)
	if len(g) != 2 || g[0].Model != "a" || g[1].Model != "b" || g[0].Values["block_size"] != "16" {
		t.Fatalf("%+v", g)
	}
}

// TestJudgePicker: the picker's own checks fail for insecure gossip, for
// an admin surface the public port serves, and for a public port that did
// not answer.
func TestJudgePicker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      PickerFacts
		failed string // the failing checks' names
		cause  string
	}{
		{"healthy", PickerFacts{PublicAdminStatus: 404}, "", ""},
		{"insecure gossip", PickerFacts{GossipInsecure: true, PublicAdminStatus: 404}, "picker gossip encrypted", "--gossip-key-file"},
		{"admin on the public port", PickerFacts{PublicAdminStatus: 200}, "picker admin private", "--admin-listen"},
		{"public port silent", PickerFacts{PublicAdminErr: "connection refused"}, "picker admin private", "--picker"},
		{"pickers agree", PickerFacts{PublicAdminStatus: 404, SharesBookings: true, Pickers: []debugapi.PeerPicker{
			{Address: "10.0.0.1:9000", State: debugapi.PeerFollowing, LastBatchSeconds: ptr(0.5)}, {Address: "10.0.0.3:9000", State: debugapi.PeerSelf}}}, "", ""},
		{"one picker", PickerFacts{PublicAdminStatus: 404, SharesBookings: true}, "", ""},
		{"pickers cannot reach each other", PickerFacts{PublicAdminStatus: 404, SharesBookings: true, Pickers: []debugapi.PeerPicker{
			{Address: "10.0.0.1:9000", State: debugapi.PeerFollowing, LastBatchSeconds: ptr(0.5)},
			{Address: "10.0.0.2:9000", State: debugapi.PeerConnecting, Error: "connection refused"}}}, "pickers agree", "NetworkPolicy"},
		{"endpoint picker serving", PickerFacts{PublicAdminStatus: 404, ExtProc: ExtProcFacts{Listen: "[::]:9002", Address: "p:9002", Status: "SERVING"}}, "", ""},
		{"endpoint picker not probed", PickerFacts{PublicAdminStatus: 404, ExtProc: ExtProcFacts{Listen: "[::]:9002", NotProbed: "mutual TLS"}}, "", ""},
		{"endpoint picker not serving", PickerFacts{PublicAdminStatus: 404, ExtProc: ExtProcFacts{Listen: "[::]:9002", Address: "p:9002", Status: "NOT_SERVING"}},
			"endpoint picker health", "/readyz"},
		{"endpoint picker unreachable", PickerFacts{PublicAdminStatus: 404, ExtProc: ExtProcFacts{Listen: "[::]:9002", Address: "p:9002", Err: "connection refused"}},
			"endpoint picker health", "--ext-proc"},
		{"engine priority honoured", PickerFacts{PublicAdminStatus: 404, EnginePriority: &debugapi.EnginePriority{}}, "", ""},
		{"engine priority refused", PickerFacts{PublicAdminStatus: 404, EnginePriority: &debugapi.EnginePriority{RefusedBy: []string{"http://10.0.0.5:8000"}}},
			"engine priority", "--scheduling-policy priority"},
		{"a picker silent", PickerFacts{PublicAdminStatus: 404, SharesBookings: true, Pickers: []debugapi.PeerPicker{
			{Address: "10.0.0.1:9000", State: debugapi.PeerFollowing, LastBatchSeconds: ptr(9.0)}}}, "pickers agree", "--peer-listen"},
	} {
		var failed []string
		for _, c := range JudgePicker(tc.f) {
			if !c.OK {
				failed = append(failed, c.Name)
				if !strings.Contains(c.Cause, tc.cause) {
					t.Errorf("%s: cause %q lacks %q", tc.name, c.Cause, tc.cause)
				}
			}
		}
		if got := strings.Join(failed, ","); got != tc.failed {
			t.Errorf("%s: failed %q, want %q", tc.name, got, tc.failed)
		}
	}
}

func ptr[T any](v T) *T { return &v }
