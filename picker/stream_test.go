package picker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// gauge sums a registry's series name, gauges or counters, over the label
// sets that have label=value (all with label "").
func gauge(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	var labels map[string]string
	if label != "" {
		labels = map[string]string{label: value}
	}
	return metrictest.Gathered(t, reg, name, labels)
}

// awaitValue polls name on reg every 10 ms until it is want, within d.
func awaitValue(t *testing.T, reg *prometheus.Registry, name string, want float64, d time.Duration) {
	t.Helper()
	testnet.Await(t, d, 10*time.Millisecond, func() error {
		if got := gauge(t, reg, name, "", ""); got != want {
			return fmt.Errorf("%s is %v, want %v", name, got, want)
		}
		return nil
	})
}

// TestCompleteAnswersNotAborted: whole answers — chat, completions and
// Responses streams, and JSON — pass through the proxy with no error in
// the OpenAI SDK and no abort counted.
func TestCompleteAnswersNotAborted(t *testing.T) {
	f := startFleet(t, 1, picker.DefaultConfig(), "")
	c := sdk(f.api.URL, nil)
	const model = "Qwen/Qwen3-0.6B"
	chat := c.Chat.Completions.NewStreaming(withTimeout(t), openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(8),
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something.")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var acc openai.ChatCompletionAccumulator
	for chat.Next() {
		acc.AddChunk(chat.Current())
	}
	if err := chat.Err(); err != nil || len(acc.Choices) == 0 || acc.Choices[0].Message.Content == "" || acc.Usage.PromptTokens == 0 {
		t.Fatalf("chat stream: %v %+v", err, acc)
	}
	comp := c.Completions.NewStreaming(withTimeout(t), openai.CompletionNewParams{Model: model, MaxTokens: openai.Int(8),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")}})
	var text strings.Builder
	for comp.Next() {
		for _, ch := range comp.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := comp.Err(); err != nil || text.Len() == 0 {
		t.Fatalf("completions stream: %v %q", err, text.String())
	}
	resp := c.Responses.NewStreaming(withTimeout(t), responses.ResponseNewParams{Model: model, MaxOutputTokens: openai.Int(8),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Hello.")}})
	completed := false
	for resp.Next() {
		completed = completed || resp.Current().Type == "response.completed"
	}
	if err := resp.Err(); err != nil || !completed {
		t.Fatalf("responses stream: %v, completed %v", err, completed)
	}
	if r, err := c.Chat.Completions.New(withTimeout(t), openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hi.")}}); err != nil || len(r.Choices) == 0 {
		t.Fatalf("chat: %v %+v", err, r)
	}
	if n := counter(t, f.reg, "kvroute_picker_stream_aborts_total"); n != 0 {
		t.Fatalf("%v aborts of whole answers", n)
	}
}

// TestClientGoneFreesEngine: a client that leaves ends its request on the
// engine (vLLM aborts a request whose client disconnected): the engine's
// running-requests gauge drops to 0 within 5 s — mid-stream, where the
// picker counts the abort as client_gone, and while a non-streaming answer
// is being generated, where nothing was written to the client yet and only
// the cancelled context tells the engine.
func TestClientGoneFreesEngine(t *testing.T) {
	f := startFleetWith(t, 1, picker.DefaultConfig(), "", func(c *enginesim.Config) {
		c.Sim.TimeScale = 1 // 25 ms a token: 2,000 tokens would take 50 s
	})
	engine := f.engines[0].Registry()
	c := sdk(f.api.URL, nil)
	params := openai.ChatCompletionNewParams{Model: "Qwen/Qwen3-0.6B", MaxTokens: openai.Int(2000),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Write a long story.")}}
	long := option.WithJSONSet("ignore_eos", true)
	t.Run("mid-stream", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stream := c.Chat.Completions.NewStreaming(ctx, params, long)
		for i := 0; i < 3; i++ { // the role chunk, then tokens
			if !stream.Next() {
				t.Fatalf("the stream ended at chunk %d: %v", i, stream.Err())
			}
		}
		if n := gauge(t, engine, "vllm:num_requests_running", "", ""); n != 1 {
			t.Fatalf("%v requests running mid-stream", n)
		}
		cancel() // the client leaves
		left := time.Now()
		for stream.Next() {
		}
		_ = stream.Close()
		awaitValue(t, engine, "vllm:num_requests_running", 0, 5*time.Second)
		t.Logf("the engine's slot freed %v after the client left", time.Since(left).Round(time.Millisecond))
		awaitValue(t, engine, "kvroute_engine_requests_aborted_total", 1, 5*time.Second)
		awaitValue(t, f.reg, "kvroute_picker_stream_aborts_total", 1, 5*time.Second)
		if n := gauge(t, f.reg, "kvroute_picker_stream_aborts_total", "cause", "client_gone"); n != 1 {
			t.Fatalf("client_gone counted %v times", n)
		}
	})
	t.Run("non-streaming", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ended := make(chan error, 1)
		go func() {
			_, err := c.Chat.Completions.New(ctx, params, long)
			ended <- err
		}()
		awaitValue(t, engine, "vllm:num_requests_running", 1, 5*time.Second)
		cancel()
		left := time.Now()
		select {
		case err := <-ended:
			if err == nil {
				t.Fatal("a cancelled request succeeded")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the cancelled request did not return within 5 s")
		}
		awaitValue(t, engine, "vllm:num_requests_running", 0, 5*time.Second)
		t.Logf("the engine's slot freed %v after the client left", time.Since(left).Round(time.Millisecond))
		awaitValue(t, engine, "kvroute_engine_requests_aborted_total", 2, 5*time.Second)
		if n := counter(t, f.reg, "kvroute_picker_stream_aborts_total"); n != 1 {
			t.Fatalf("%v aborts counted: nothing had been written to this client", n)
		}
	})
}
