package pickapi_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/pickapi"
)

// full has every field of an explained answer set; bare a plain answer's
// (no prefix_hash, candidates or keys: omitted, not null).
const (
	full = `{"endpoint":"http://10.0.0.1:8000","endpoint_id":"a1b2c3","model":"Qwen/Qwen3-0.6B","prompt_tokens":583,` +
		`"matched_tokens":576,"matched_blocks":36,"prefix_hash":"00112233aabbccdd","predicted_ttft_ms":41.5,"kv_source":"10.0.0.3:5710",` +
		`"kv_source_tokens":4096,"policy":"precise","reason":"cache_hit",` +
		`"candidates":[{"endpoint":"http://10.0.0.1:8000","matched_tokens":576,"cpu_matched_tokens":16,"storage_matched_tokens":32,` +
		`"in_flight":1.5,"estimated_cost_tokens":7.25,"under_load_cap":true,"why":"chosen"}],"keys":["0011223344556677","8899aabbccddeeff"]}`
	bare = `{"endpoint":"http://10.0.0.2:8000","endpoint_id":"d4e5f6","model":"m","prompt_tokens":10,"matched_tokens":0,` +
		`"matched_blocks":0,"kv_source":"","kv_source_tokens":0,"policy":"precise","reason":"cold","candidates":[{"endpoint":"http://10.0.0.2:8000","matched_tokens":0,` +
		`"in_flight":0,"estimated_cost_tokens":10,"under_load_cap":false,"why":"lost"}]}`
)

// roundTrip decodes s into v, refusing unknown fields, and encodes v again.
func roundTrip(t *testing.T, s string, v any) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%T: %v", v, err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAnswerIsThePickersAnswer: the picker's Pick and Answer read and
// write the same JSON, field for field, in the same order: a field renamed,
// added or dropped on either side fails here.
func TestAnswerIsThePickersAnswer(t *testing.T) {
	for _, s := range []string{full, bare} {
		if got := roundTrip(t, s, &pickapi.Answer{}); got != s {
			t.Errorf("Answer:\n got %s\nwant %s", got, s)
		}
		if got := roundTrip(t, s, &picker.Pick{}); got != s {
			t.Errorf("picker.Pick:\n got %s\nwant %s", got, s)
		}
	}
	// Every field decodes to its value.
	var a pickapi.Answer
	if err := json.Unmarshal([]byte(full), &a); err != nil {
		t.Fatal(err)
	}
	c := a.Candidates[0]
	if a.EndpointID != "a1b2c3" || a.PromptTokens != 583 || a.MatchedBlocks != 36 || a.PrefixHash != "00112233aabbccdd" ||
		a.Reason != "cache_hit" || len(a.Keys) != 2 || c.CPUTokens != 16 || c.StorageTokens != 32 || c.InFlight != 1.5 ||
		c.Cost != 7.25 || !c.UnderCap || c.Why != "chosen" || a.PredictedTTFTMs != 41.5 || a.KVSource != "10.0.0.3:5710" || a.KVSourceTokens != 4096 {
		t.Fatalf("%+v", a)
	}
}

func TestMostMatched(t *testing.T) {
	for _, tc := range []struct {
		a    pickapi.Answer
		want int
	}{
		{pickapi.Answer{}, 0},
		{pickapi.Answer{MatchedTokens: 32}, 32},
		{pickapi.Answer{MatchedTokens: 0, Candidates: []pickapi.Candidate{{MatchedTokens: 16}, {MatchedTokens: 48}}}, 48},
		{pickapi.Answer{MatchedTokens: 64, Candidates: []pickapi.Candidate{{MatchedTokens: 16, CPUTokens: 128}}}, 64},
	} {
		if got := tc.a.MostMatched(); got != tc.want {
			t.Errorf("%+v: %d, want %d", tc.a, got, tc.want)
		}
	}
}
