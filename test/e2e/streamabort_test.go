package e2e

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvroute/kvroute/test/testnet"
)

// TestStreamCutBySIGKILL: a chat stream through the picker process whose
// engine process is SIGKILLed mid-stream ends in an error in the OpenAI
// Go SDK's stream reader — the picker aborts the client's response rather
// than ending it cleanly — and the picker counts it as upstream_error for
// that engine (the picker runs with --per-endpoint-metrics: the engine
// label is there). A whole stream before it ends with no error and no
// abort.
func TestStreamCutBySIGKILL(t *testing.T) {
	bin := buildKvroute(t)
	// Real simulated time: 25 ms a token, so 400 tokens take 10 s.
	f := startHealthFleet(t, bin, 1, []string{"--sim-time-scale", "1"}, nil, "--per-endpoint-metrics")
	engine := f.urls[0]
	c := openai.NewClient(option.WithBaseURL(f.picker+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	params := func(n int64) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: "Qwen/Qwen3-0.6B", MaxTokens: openai.Int(n),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about caches.")}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	whole := c.Chat.Completions.NewStreaming(ctx, params(4))
	chunks := 0
	for whole.Next() {
		chunks++
	}
	if err := whole.Err(); err != nil || chunks == 0 {
		t.Fatalf("a whole stream: %d chunks, %v", chunks, err)
	}
	if n := f.metric(t, "kvroute_picker_stream_aborts_total", nil); n != 0 {
		t.Fatalf("%v aborts after a whole stream", n)
	}

	stream := c.Chat.Completions.NewStreaming(ctx, params(400), option.WithJSONSet("ignore_eos", true))
	for i := 0; i < 2; i++ { // the role chunk and a first token: the stream is running
		if !stream.Next() {
			t.Fatalf("the stream ended at chunk %d: %v", i, stream.Err())
		}
	}
	if err := f.engines[0].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	n := 0
	for stream.Next() {
		n++
	}
	err := stream.Err()
	if err == nil {
		t.Fatalf("the SDK saw a clean end %d chunks after the engine's SIGKILL", n)
	}
	if ctx.Err() != nil {
		t.Fatalf("the stream only ended with the test's deadline: %v", err)
	}
	t.Logf("the SDK's stream ended %v after SIGKILL: %v", time.Since(killed).Round(time.Millisecond), err)
	label := map[string]string{"cause": "upstream_error", "engine": engine}
	testnet.Await(t, 5*time.Second, 20*time.Millisecond, func() error {
		if got := f.metric(t, "kvroute_picker_stream_aborts_total", label); got != 1 {
			return fmt.Errorf("kvroute_picker_stream_aborts_total%v is %v", label, got)
		}
		return nil
	})
	if got := f.metric(t, "kvroute_picker_stream_aborts_total", nil); got != 1 {
		t.Fatalf("%v aborts counted in all, want 1", got)
	}
}
