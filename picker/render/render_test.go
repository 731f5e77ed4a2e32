package render_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/render"
	"github.com/kvroute/kvroute/test/enginesim"
)

func startEngine(t *testing.T, scaleOut bool) *enginesim.Engine {
	t.Helper()
	cfg := enginesim.DefaultConfig()
	cfg.Host, cfg.Port = "127.0.0.1", 0
	cfg.Sim.TimeScale = 0
	cfg.EnableScaleOutEndpoints = scaleOut
	p, err := enginesim.Start(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p.Engines()[0]
}

const conversation = `{"model":"Qwen/Qwen3-0.6B","cache_salt":"tenant-a","instructions":"You are terse.",
	"tools":[{"type":"function","name":"lookup","description":"find a thing","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}],
	"input":[{"role":"user","content":"Find the answer."},
		{"role":"assistant","content":[{"type":"output_text","text":"Let me look."}]},
		{"type":"function_call","call_id":"call_1","name":"lookup","arguments":"{\"q\":\"answer\"}"},
		{"type":"function_call","call_id":"call_2","name":"lookup","arguments":"{\"q\":\"more\"}"},
		{"type":"function_call_output","call_id":"call_1","output":"42"},
		{"type":"function_call_output","call_id":"call_2","output":"43"},
		{"role":"assistant","content":[{"type":"output_text","text":"It is 42."}]},
		{"role":"user","content":[{"type":"input_text","text":"And the second?"}]}]}`

// TestRenderPaths: each kind renders through its endpoint; a Responses
// request on an engine without Responses render is mapped to chat and
// yields the very tokens the engine's own Responses render gives.
func TestRenderPaths(t *testing.T) {
	withRender, without := startEngine(t, true), startEngine(t, false)
	c := render.New(5*time.Second, 8<<20)
	defer c.Close()
	ctx := context.Background()

	native, err := c.Render(ctx, withRender.URL(), intake.Responses, []byte(conversation))
	if err != nil || native.Via != render.ViaResponsesRender || len(native.TokenIDs) == 0 || native.CacheSalt != "tenant-a" {
		t.Fatalf("responses render: %+v %v", native, err)
	}
	mapped, err := c.Render(ctx, without.URL(), intake.Responses, []byte(conversation))
	if err != nil || mapped.Via != render.ViaResponsesAsChat {
		t.Fatalf("responses as chat: %+v %v", mapped, err)
	}
	if !slices.Equal(native.TokenIDs, mapped.TokenIDs) {
		t.Fatalf("mapped Responses render differs from the engine's: %d vs %d tokens", len(mapped.TokenIDs), len(native.TokenIDs))
	}
	ch, err := c.Render(ctx, without.URL(), intake.Chat, []byte(`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil || ch.Via != render.ViaChatRender || len(ch.TokenIDs) == 0 {
		t.Fatalf("chat render: %+v %v", ch, err)
	}
	co, err := c.Render(ctx, without.URL(), intake.Completion, []byte(`{"model":"Qwen/Qwen3-0.6B","prompt":"once upon a time"}`))
	if err != nil || co.Via != render.ViaCompletionsRender || len(co.TokenIDs) == 0 {
		t.Fatalf("completions render: %+v %v", co, err)
	}
	// The engine's refusal comes back as such.
	_, err = c.Render(ctx, without.URL(), intake.Chat, []byte(`{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`))
	var refused *render.RefusedError
	if !errors.As(err, &refused) || refused.Status != http.StatusNotFound {
		t.Fatalf("unknown model: %v", err)
	}
}

// TestRenderTimeout: a render that does not answer in time is an error,
// not a hang.
func TestRenderTimeout(t *testing.T) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})}
	ln := listen(t)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	c := render.New(100*time.Millisecond, 1<<20)
	t0 := time.Now()
	if _, err := c.Render(context.Background(), "http://"+ln.Addr().String(), intake.Chat, []byte(`{}`)); err == nil {
		t.Fatal("no error")
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
}

// TestRenderAPIKey: with an engine key, every render call carries it; a
// rotated key (SetAPIKey) is carried from the next call on.
func TestRenderAPIKey(t *testing.T) {
	var got string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"token_ids":[1,2,3],"cache_salt":null,"features":null}`))
	})}
	ln := listen(t)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	c := render.New(time.Second, 1<<20).WithAPIKey("k3y")
	r, err := c.Render(context.Background(), "http://"+ln.Addr().String(), intake.Chat, []byte(`{}`))
	if err != nil || got != "Bearer k3y" || len(r.TokenIDs) != 3 {
		t.Fatalf("%+v %v, header %q", r, err, got)
	}
	c.SetAPIKey("n3w")
	if _, err := c.Render(context.Background(), "http://"+ln.Addr().String(), intake.Chat, []byte(`{}`)); err != nil || got != "Bearer n3w" {
		t.Fatalf("after SetAPIKey: %v, header %q", err, got)
	}
}
