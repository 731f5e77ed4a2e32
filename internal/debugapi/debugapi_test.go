package debugapi

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden file")

// example is a document that sets every field somewhere (TestExampleFull),
// and shows a bare endpoint and refusal with their optional fields
// omitted.
func example() Document {
	lag, medianErr, peerLag, lastBatch := 0.018, 0.12, 0.002, 0.4
	return Document{
		Endpoints: []Endpoint{{
			Endpoint: "http://10.0.0.1:8000", EndpointID: "0123456789abcdef", Sidecar: "10.0.0.1:9090", SidecarDebug: "http://10.0.0.1:9091",
			Group: "g1", Model: "m", Rank: 1, BlockSize: 16, NumGPUBlocks: 4096, HashAlgo: "sha256_cbor", KeyFormat: "kvroute-xxh3-v1",
			SummaryParams: "m=65536", TokenizerFingerprint: "tok", Epoch: 3, Partial: true, KVSource: "10.0.0.1:5711", Waiting: 2, Running: 5, KVUsage: 0.25,
			StaleSecs: 0.5, State: "down", StateReason: "the sidecar cannot reach the engine: refused", StreamState: "partial",
			StreamReason: "lost events", EngineDown: true, EngineError: "refused", LagSeconds: &lag,
			TTFT: &TTFTEndpoint{SpeedFactor: 1.2, Observations: 40, MeanUncachedTokens: 900, MeanQueueSeconds: 0.05, MeanPrefillSeconds: 0.09,
				MeanTTFTSeconds: 0.14},
		}, {
			Endpoint: "http://10.0.0.2:8000", EndpointID: "fedcba9876543210", Sidecar: "10.0.0.2:9090", Group: "g1", Model: "m",
			BlockSize: 16, NeverUpdated: true, State: "cached",
		}},
		Picker: Picker{GossipInsecure: true, Instance: "0a1b2c3d4e5f6071", SharesBookings: true, Pickers: []PeerPicker{
			{Address: "10.0.0.8:9001", Awaiting: 2, Expired: 1, Instance: "9f86d081884c7d65", LagSeconds: &peerLag, LastBatchSeconds: &lastBatch,
				Live: 5, Received: 40, State: PeerFollowing},
			{Address: "10.0.0.9:9001", Error: "connection refused", State: PeerConnecting}},
			ExtProc:        &ExtProc{Address: "[::]:9002", TLS: true, ClientCert: true},
			EnginePriority: &EnginePriority{RefusedBy: []string{"http://10.0.0.6:8000"}}},
		Refused: []Refusal{{
			Endpoint: "http://203.0.113.7:8000", Sidecar: "10.0.0.3:9090", Reason: "remote_endpoint", Model: "m", BlockSize: 16,
			SummaryParams: "m=65536", TokenizerFingerprint: "tok", Since: "2026-01-02T03:04:05.5Z", Detail: "not on the sidecar's host",
		}, {
			Endpoint: "http://10.0.0.4:8000", Sidecar: "10.0.0.4:9090", Reason: "summary_params", Model: "m", SummaryParams: "m=1",
		}},
		SidecarsFailing: []SidecarFailing{{Sidecar: "10.0.0.5:9090", Reason: "tls", Error: "x509: unknown authority", SecondsFailing: 12.5}},
		TTFTModels: []TTFTModel{{Group: "g1", Coefficients: map[string]float64{"overhead_s": 0.03, "tail_s_per_ktok": 0.1}, Observations: 80,
			MedianRelativeError: &medianErr, MeanUncachedTokens: 1200}},
	}
}

// TestGolden pins the JSON names, their order and what is omitted when
// empty: a name changed here is a change of the picker's admin API, which
// older verify versions and scripts read.
func TestGolden(t *testing.T) {
	b, err := json.MarshalIndent(example(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	golden := filepath.Join("testdata", "endpoints.golden.json")
	if *update {
		if err := os.WriteFile(golden, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("the document's JSON changed (go test -update rewrites %s if meant):\n%s", golden, b)
	}
	var back Document
	dec := json.NewDecoder(bytes.NewReader(want))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&back); err != nil || !reflect.DeepEqual(back, example()) {
		t.Errorf("the golden reads back as %+v (%v), want the example", back, err)
	}
}

// TestExampleFull: every field of the document is set in some element of
// the example, so the golden names them all.
func TestExampleFull(t *testing.T) {
	if unset := Unset(example()); len(unset) > 0 {
		t.Errorf("the example leaves unset: %v", unset)
	}
	var fields int
	for _, v := range []any{Endpoint{}, Picker{}, Refusal{}, SidecarFailing{}, TTFTModel{}} {
		fields += reflect.TypeOf(v).NumField()
	}
	unset := Unset(Document{Endpoints: []Endpoint{{Endpoint: "http://e"}}})
	if len(unset) != fields-1 || slices.Contains(unset, "endpoints[].endpoint") ||
		!slices.Contains(unset, "endpoints[].lag_seconds") || !slices.Contains(unset, "picker.gossip_insecure") {
		t.Errorf("Unset of a document with one URL: %v, want the %d other fields", unset, fields-1)
	}
}
