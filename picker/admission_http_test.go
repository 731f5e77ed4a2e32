package picker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/zeebo/xxh3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/picker"
	fleetpkg "github.com/kvroute/kvroute/picker/fleet"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/testnet"
)

type answer struct {
	status int
	body   string
	header http.Header
	err    error
}

// postAsync sends a chat body to the picker with headers, in a goroutine.
func postAsync(ctx context.Context, url, body string, hdr map[string]string) chan answer {
	ch := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			ch <- answer{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- answer{status: resp.StatusCode, body: string(b), header: resp.Header, err: err}
	}()
	return ch
}

// TestAdmissionOverHTTP: with the one engine saturated (a request before
// its first byte), the next request waits in the picker's queue and shows
// on /debug/admission; the queue full, a newcomer gets 429
// rate_limit_exceeded with Retry-After, as the OpenAI SDK reads it; one of
// higher priority displaces the waiter (429); once the engine answers the
// first, the one waiting is served whole.
func TestAdmissionOverHTTP(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.Admission.MaxWaiting, cfg.Admission.MaxKVUsage, cfg.Admission.MaxPrefillTokens = 0, 0, 1 // any prefill in flight saturates
	cfg.Admission.QueueSize, cfg.Admission.StandingTimeout = 1, 0                                // the waiters outwait the first request's prefill
	f := startFleetWith(t, 1, cfg, "", func(c *enginesim.Config) {
		c.Sim.TimeScale, c.Sim.PrefillTokensPerSecond = 1, 200 // a prompt of ~300 tokens takes ~1.5 s to its first token
	})
	ctx := withTimeout(t)
	long := `{"model":"Qwen/Qwen3-0.6B","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"` + strings.Repeat("tell me about prefix caching ", 50) + `"}]}`
	short := func(s string) string {
		return `{"model":"Qwen/Qwen3-0.6B","max_tokens":2,"messages":[{"role":"user","content":"` + s + `"}]}`
	}
	first := postAsync(ctx, f.api.URL, long, nil)
	// The first request's prefill is in flight once the decision is made.
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		if v, _ := series(t, f.reg, "kvroute_picker_admission_total", map[string]string{"result": "admitted"}); v < 1 {
			return errors.New("the first request was not admitted yet")
		}
		return nil
	})
	waiter := postAsync(ctx, f.api.URL, short("second"), map[string]string{"x-kvroute-tenant": "acme", "x-kvroute-priority": "5"})
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		resp, err := http.Get(f.admin.URL + "/debug/admission")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var d struct {
			Models []picker.AdmissionState `json:"models"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
			return err
		}
		if len(d.Models) != 1 || !d.Models[0].Saturated || d.Models[0].ByKey["tenant:acme"] != 1 {
			b, _ := json.Marshal(d)
			v, _ := series(t, f.reg, "kvroute_picker_admission_total", map[string]string{"result": "admitted"})
			select {
			case a := <-first:
				t.Fatalf("first done: %d %q %v", a.status, a.body[:min(len(a.body), 300)], a.err)
			default:
			}
			return fmt.Errorf("the second request is not shown waiting: %s (admitted %v)", b, v)
		}
		return nil
	})
	// Full, of a higher priority: the SDK sees a 429 rate-limit error with
	// Retry-After.
	var hdr http.Header
	client := sdk(f.api.URL, &hdr)
	_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "Qwen/Qwen3-0.6B",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("third")}})
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusTooManyRequests || oe.Type != "rate_limit_exceeded" || oe.Code != "queue_full" {
		t.Fatalf("a request to a full queue: %v, want 429 rate_limit_exceeded queue_full", err)
	}
	if hdr.Get("Retry-After") == "" {
		t.Fatal("the 429 has no Retry-After")
	}
	// A newcomer of the waiter's band makes room: the waiter goes.
	urgent := postAsync(ctx, f.api.URL, short("urgent"), map[string]string{"x-kvroute-priority": "5"})
	a := <-waiter
	if a.err != nil || a.status != http.StatusTooManyRequests || !strings.Contains(a.body, `"queue_displaced"`) || a.header.Get("Retry-After") == "" {
		t.Fatalf("the displaced waiter: %d %s %v", a.status, a.body, a.err)
	}
	if a := <-first; a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, "data: [DONE]") {
		t.Fatalf("the first request: %d %v", a.status, a.err)
	}
	if a := <-urgent; a.err != nil || a.status != http.StatusOK {
		t.Fatalf("the urgent request after the first was answered: %d %s %v", a.status, a.body, a.err)
	}
	for result, want := range map[string]float64{"shed": 1, "displaced": 1, "queued": 1} {
		if v, _ := series(t, f.reg, "kvroute_picker_admission_total", map[string]string{"result": result}); v != want {
			t.Errorf("admission_total{result=%q} = %v, want %v", result, v, want)
		}
	}
	// A bad priority is a 400, before anything is routed.
	if a := <-postAsync(ctx, f.api.URL, short("x"), map[string]string{"x-kvroute-priority": "urgent"}); a.status != http.StatusBadRequest || !strings.Contains(a.body, "invalid_priority") {
		t.Fatalf("a bad priority: %d %s", a.status, a.body)
	}
}

// TestDecisionsDoNotSaturate: the decision API's picks, which the picker
// never sees end, do not count as prefill in flight: after many long
// decisions a proxied request is admitted at once.
func TestDecisionsDoNotSaturate(t *testing.T) {
	f := startFleet(t, 1, picker.DefaultConfig(), "")
	ctx := withTimeout(t)
	for i := range 10 {
		body := fmt.Sprintf(`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"decision %d %s"}]}`, i, strings.Repeat("a long uncached prompt ", 200))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.api.URL+"/routing/v1/pick", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("decision %d: %s", i, resp.Status)
		}
	}
	a := <-postAsync(ctx, f.api.URL, `{"model":"Qwen/Qwen3-0.6B","max_tokens":2,"messages":[{"role":"user","content":"after the decisions"}]}`, nil)
	if a.err != nil || a.status != http.StatusOK {
		t.Fatalf("a proxied request after the decisions: %d %s %v", a.status, a.body, a.err)
	}
	if v, _ := series(t, f.reg, "kvroute_picker_admission_total", map[string]string{"result": "admitted"}); v != 1 {
		t.Fatalf("admitted at once: %v, want 1 (not queued)", v)
	}
}

// TestAdmitDecisions: with Config.AdmitDecisions (--admit-decisions), a
// decision request for a saturated model gets 429 rate_limit_exceeded
// model_saturated with Retry-After over HTTP, and RESOURCE_EXHAUSTED with
// a RetryInfo detail and retry-after metadata over gRPC, counted in
// admission_total as decision_shed under its fairness key; once the model
// has room, a decision again. Without it, the saturated model's decision
// is given as always.
func TestAdmitDecisions(t *testing.T) {
	body := `{"model":"Qwen/Qwen3-0.6B","cache_salt":"s","messages":[{"role":"user","content":"where would this go?"}]}`
	saturate := func(f *fleet, waiting float64) {
		t.Helper()
		e := f.local.Endpoints()[0]
		f.local.SetLoad(e.URL, fleetpkg.Load{Waiting: waiting}, time.Now())
	}
	t.Run("on", func(t *testing.T) {
		cfg := picker.DefaultConfig()
		cfg.AdmitDecisions = true
		f, _ := startGated(t, cfg)
		client := f.grpcClient(t, "")
		saturate(f, 10) // past --saturation-waiting 5
		code, _, raw := f.pick(t, body, http.Header{"X-Kvroute-Tenant": {"acme"}}, "")
		if code != http.StatusTooManyRequests || !strings.Contains(string(raw), `"code":"model_saturated"`) || !strings.Contains(string(raw), `"rate_limit_exceeded"`) {
			t.Fatalf("a decision for a saturated model: %d %s, want 429 model_saturated", code, raw)
		}
		req, _ := http.NewRequest(http.MethodPost, f.api.URL+"/routing/v1/pick", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("%s, Retry-After %q: want 429 with Retry-After 1 (nothing queued: the next load report may give room)", resp.Status, resp.Header.Get("Retry-After"))
		}
		var trailer metadata.MD
		_, err = client.Pick(withTimeout(t), &pb.PickRequest{Body: []byte(body)}, grpc.Trailer(&trailer))
		st := status.Convert(err)
		var info *errdetails.RetryInfo
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				info = ri
			}
		}
		if st.Code() != codes.ResourceExhausted || info == nil || info.GetRetryDelay().AsDuration() != time.Second ||
			!slices.Equal(trailer.Get("retry-after"), []string{"1"}) || !strings.Contains(st.Message(), "model_saturated") {
			t.Fatalf("gRPC: %v (details %v, trailer %v), want RESOURCE_EXHAUSTED with RetryInfo 1s and retry-after 1", err, st.Details(), trailer)
		}
		for key, want := range map[string]float64{"tenant:acme": 1, "salt:" + fmt.Sprintf("%016x", xxh3.HashString("s"))[:8]: 2} {
			if v, _ := series(t, f.reg, "kvroute_picker_admission_total", map[string]string{"fairness_key": key, "result": "decision_shed"}); v != want {
				t.Errorf("admission_total{fairness_key=%q,result=decision_shed} = %v, want %v", key, v, want)
			}
		}
		if v := gauge(t, f.reg, "kvroute_picker_model_saturated", "model", "Qwen/Qwen3-0.6B"); v != 1 {
			t.Errorf("model_saturated %v, want 1", v)
		}
		saturate(f, 0)
		if code, a, raw := f.pick(t, body, nil, ""); code != http.StatusOK || a.Endpoint == "" {
			t.Fatalf("a decision once the model has room: %d %s", code, raw)
		}
		if _, err := client.Pick(withTimeout(t), &pb.PickRequest{Body: []byte(body)}); err != nil {
			t.Fatalf("gRPC, once the model has room: %v", err)
		}
	})
	t.Run("off", func(t *testing.T) {
		f, _ := startGated(t, picker.DefaultConfig())
		client := f.grpcClient(t, "")
		saturate(f, 10)
		if code, a, raw := f.pick(t, body, nil, ""); code != http.StatusOK || a.Endpoint == "" {
			t.Fatalf("without --admit-decisions a saturated model's decision: %d %s, want 200", code, raw)
		}
		if _, err := client.Pick(withTimeout(t), &pb.PickRequest{Body: []byte(body)}); err != nil {
			t.Fatalf("gRPC, without --admit-decisions: %v", err)
		}
		if v, _ := series(t, f.reg, "kvroute_picker_admission_total", map[string]string{"result": "decision_shed"}); v != 0 {
			t.Fatalf("decision_shed %v without the flag", v)
		}
	})
}
