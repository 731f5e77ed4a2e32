package picker_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/test/enginesim"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestServerDrain: Drain fails /readyz at once with the reason and the
// draining gauge at 1, while a stream in flight goes on; Close then stops
// accepting and lets that stream finish whole (the SDK sees no error and
// a finish reason); after Close nothing is accepted.
func TestServerDrain(t *testing.T) {
	pod := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond,
		Engine: func(c *enginesim.Config) { c.Sim.TimeScale = 1 }}) // decoding takes real time
	cfg := picker.DefaultServerConfig()
	cfg.Listen, cfg.AdminListen, cfg.GRPCListen = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.Sidecars, cfg.Capacity = []string{pod.Sidecar.GRPCAddr()}, capacity
	cfg.DrainDelay, cfg.ShutdownTimeout = 300*time.Millisecond, 20*time.Second
	reg := prometheus.NewRegistry()
	s, err := picker.Start(context.Background(), cfg, zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	base := "http://" + s.Addr()
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + s.AdminAddr() + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if code, body := readyz(); code != 200 {
			return fmt.Errorf("the picker is not ready: %d %q", code, body)
		}
		return nil
	})
	client := sdk(base, nil)
	stream := client.Chat.Completions.NewStreaming(withTimeout(t), openai.ChatCompletionNewParams{Model: "Qwen/Qwen3-0.6B",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a long story.")}, MaxTokens: openai.Int(60)})
	if !stream.Next() {
		t.Fatalf("no first chunk: %v", stream.Err())
	}
	closed := make(chan struct{})
	go func() {
		s.Drain(context.Background(), "test says so")
		s.Close()
		close(closed)
	}()
	testnet.Await(t, 5*time.Second, 10*time.Millisecond, func() error {
		if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "test says so") {
			return fmt.Errorf("/readyz still %d %q while draining", code, body)
		}
		return nil
	})
	if n, _ := series(t, reg, "kvroute_picker_draining", nil); n != 1 {
		t.Fatalf("draining gauge %v", n)
	}
	var finish string
	for stream.Next() {
		for _, c := range stream.Current().Choices {
			if c.FinishReason != "" {
				finish = c.FinishReason
			}
		}
	}
	if err := stream.Err(); err != nil || finish == "" {
		t.Fatalf("the stream in flight was cut by the drain: %v (finish %q)", err, finish)
	}
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return within the shutdown timeout")
	}
	if _, err := http.Get(base + "/v1/models"); err == nil {
		t.Fatal("the picker still accepts after Close")
	}
	if _, err := http.Get("http://" + s.AdminAddr() + "/readyz"); err == nil {
		t.Fatal("the picker's admin port still accepts after Close")
	}
}
