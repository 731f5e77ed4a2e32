package picker_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/predict"
	"github.com/kvroute/kvroute/test/metrictest"
)

// TestPredictedTTFTIsLearnedAndShown: streamed answers teach the TTFT
// model; the prediction rides on every answer (x-kvroute-predicted-ttft-ms
// and the decision API's predicted_ttft_ms); the model's coefficients and
// observations, and each endpoint's speed factor, show on
// /debug/endpoints and as metrics, with the prediction error per request.
func TestPredictedTTFTIsLearnedAndShown(t *testing.T) {
	f := startFleet(t, 2, picker.DefaultConfig(), "")
	const n = 6
	for i := range n {
		body := fmt.Sprintf(`{"model":"Qwen/Qwen3-0.6B","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"Question %d: %s"}]}`,
			i, strings.Repeat("words to fill some blocks ", 10*(i+1)))
		resp, err := http.Post(f.api.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ms, err := strconv.ParseFloat(resp.Header.Get("X-Kvroute-Predicted-Ttft-Ms"), 64)
		if resp.StatusCode != 200 || err != nil || !(ms > 0) {
			t.Fatalf("request %d: %d, x-kvroute-predicted-ttft-ms %q", i, resp.StatusCode, resp.Header.Get("X-Kvroute-Predicted-Ttft-Ms"))
		}
	}
	code, ans, raw := f.pick(t, `{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"hello"}]}`, nil, "")
	if code != 200 || !(ans.PredictedTTFTMs > 0) {
		t.Fatalf("decision API: %d %s", code, raw)
	}

	resp, err := http.Get(f.admin.URL + debugapi.Path)
	if err != nil {
		t.Fatal(err)
	}
	var dbg debugapi.Document
	err = json.NewDecoder(resp.Body).Decode(&dbg)
	resp.Body.Close()
	if err != nil || len(dbg.TTFTModels) != 1 {
		t.Fatalf("/debug/endpoints: %v, ttft_models %+v", err, dbg.TTFTModels)
	}
	for _, m := range dbg.TTFTModels {
		g := m.Group
		if m.Observations != n || m.MedianRelativeError == nil || len(m.Coefficients) != predict.NumTerms || m.MeanUncachedTokens <= 0 {
			t.Errorf("group %s: %+v, want %d observations, an error and %d coefficients", g, m, n, predict.NumTerms)
		}
	}
	learned := 0
	for _, e := range dbg.Endpoints {
		if e.TTFT != nil && e.TTFT.Observations > 0 && e.TTFT.SpeedFactor > 0 {
			learned += e.TTFT.Observations
		}
	}
	if learned != n {
		t.Errorf("endpoints learned from %d requests, want %d", learned, n)
	}

	fams, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if h := metrictest.HistogramOf(fams, "kvroute_picker_ttft_prediction_error_ratio", nil); h.Count != n {
		t.Errorf("prediction error histogram counts %d, want %d", h.Count, n)
	}
	if got := metrictest.Sum(fams, "kvroute_picker_ttft_model_observations", nil); got != n {
		t.Errorf("kvroute_picker_ttft_model_observations %v, want %d", got, n)
	}
	if got := metrictest.Series(fams, "kvroute_picker_ttft_model_coefficient", nil); got != predict.NumTerms {
		t.Errorf("%d coefficient series, want %d", got, predict.NumTerms)
	}
}

// TestSLOHeader: x-kvroute-slo-ttft-ms must be one positive number of
// milliseconds up to an hour; anything else is a 400 in OpenAI's format
// (counted), and a good one is routed.
func TestSLOHeader(t *testing.T) {
	f := startFleet(t, 2, picker.DefaultConfig(), "")
	body := `{"model":"Qwen/Qwen3-0.6B","max_tokens":2,"messages":[{"role":"user","content":"hello there"}]}`
	for _, tc := range []struct {
		values []string
		status int
	}{
		{[]string{"500"}, 200},
		{[]string{"250.5"}, 200},
		{[]string{"fast"}, 400},
		{[]string{"0"}, 400},
		{[]string{"-3"}, 400},
		{[]string{"3600001"}, 400},
		{[]string{"100", "200"}, 400},
	} {
		for _, path := range []string{"/v1/chat/completions", "/routing/v1/pick"} {
			req, _ := http.NewRequest(http.MethodPost, f.api.URL+path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			for _, v := range tc.values {
				req.Header.Add(picker.SLOHeader, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("%s with %q: %d %s, want %d", path, tc.values, resp.StatusCode, raw, tc.status)
			}
			if tc.status == 400 && !strings.Contains(string(raw), `"code":"invalid_slo"`) {
				t.Fatalf("%s with %q: %s, want code invalid_slo", path, tc.values, raw)
			}
		}
	}
}
