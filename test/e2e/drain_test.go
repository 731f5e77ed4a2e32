package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvroute/kvroute/test/testnet"
)

// TestPickerDrain: a picker process SIGTERMed with a stream in flight
// fails /readyz at once, serves on for its drain delay, then stops
// accepting while the stream finishes whole: the SDK sees no error and a
// finish reason. Then the process exits on its own.
func TestPickerDrain(t *testing.T) {
	bin := buildKvroute(t)
	// Real simulated time: 25 ms a token, so 120 tokens take about 3 s.
	f := startHealthFleet(t, bin, 1, []string{"--sim-time-scale", "1"}, nil, "--drain-delay", "1s", "--shutdown-timeout", "20s")
	c := openai.NewClient(option.WithBaseURL(f.picker+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "Qwen/Qwen3-0.6B", MaxTokens: openai.Int(120),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about caches.")}}, option.WithJSONSet("ignore_eos", true))
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	if err := f.pickerP.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, 5*time.Second, 20*time.Millisecond, func() error {
		resp, err := http.Get(f.admin + "/readyz")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "draining") {
			return fmt.Errorf("not draining after SIGTERM: /readyz %d %q", resp.StatusCode, b)
		}
		return nil
	})
	var finish string
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
	}
	if err := stream.Err(); err != nil || finish == "" {
		t.Fatalf("the stream in flight was cut by the drain: %v (finish %q)", err, finish)
	}
	exited := make(chan error, 1)
	go func() { exited <- f.pickerP.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the drained picker exited with %v", err)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("the drained picker did not exit within its shutdown timeout")
	}
}
