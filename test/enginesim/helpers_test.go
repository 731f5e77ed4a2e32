package enginesim_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// testConfig is a small, fast engine on loopback with ephemeral ports.
func testConfig() enginesim.Config {
	cfg := enginesim.DefaultConfig()
	cfg.Host = "127.0.0.1"
	cfg.Port = 0
	cfg.NumGPUBlocks = 4096
	cfg.MaxModelLen = 8192
	cfg.Sim.TimeScale = 0
	cfg.EnablePromptTokensDetails = true
	return cfg
}

func start(t *testing.T, cfg enginesim.Config) *enginesim.Process {
	t.Helper()
	p, err := enginesim.Start(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// withEvents enables events with the PUB connecting to endpoint (a bound
// SUB), and replay on an ephemeral loopback port.
func withEvents(cfg *enginesim.Config, endpoint string) {
	replay := "tcp://127.0.0.1:*"
	cfg.KVEvents = enginesim.DefaultKVEventsConfig()
	cfg.KVEvents.EnableKVCacheEvents = true
	cfg.KVEvents.Endpoint = endpoint
	cfg.KVEvents.ReplayEndpoint = &replay
	cfg.KVEvents.Topic = "kv@test@model"
}

// sub is a SUB socket bound on a free loopback port, as a sidecar in bind
// mode would be.
type sub struct {
	t        *testing.T
	ctx      *zmq.Context
	sock     *zmq.Socket
	endpoint string
}

func newSub(t *testing.T, bind bool, endpoint string) *sub {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []func() error{
		func() error { return s.SetLinger(0) },
		func() error { return s.SetSubscribe("") },
		func() error { return s.SetRcvtimeo(100 * time.Millisecond) },
	} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	if bind {
		if err := s.Bind(endpoint); err != nil {
			t.Fatal(err)
		}
		if endpoint, err = s.GetLastEndpoint(); err != nil {
			t.Fatal(err)
		}
	} else if err := s.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); ctx.Term() })
	return &sub{t: t, ctx: ctx, sock: s, endpoint: endpoint}
}

// msg is one received live message, decoded.
type msg struct {
	topic string
	seq   uint64
	batch *kvevents.Batch
}

// recv returns the next message, or ok=false when none comes within the
// timeout.
func (s *sub) recv(timeout time.Duration) (msg, bool) {
	s.t.Helper()
	if err := s.sock.SetRcvtimeo(timeout); err != nil {
		s.t.Fatal(err)
	}
	frames, err := s.sock.RecvMessageBytes(0)
	if err != nil {
		return msg{}, false
	}
	m, err := kvevents.ParseMessage(frames)
	if err != nil {
		s.t.Fatalf("bad frames: %v", err)
	}
	b, err := kvevents.Decode(m.Payload)
	if err != nil {
		s.t.Fatalf("bad payload at seq %d: %v", m.Seq, err)
	}
	return msg{string(m.Topic), m.Seq, b}, true
}

// waitLive sends warm-up prompts until the subscription delivers events,
// then drains, so later messages are not lost to ZeroMQ's slow joiner.
func (s *sub) waitLive(url string) {
	s.t.Helper()
	i := 0
	testnet.Await(s.t, 10*time.Second, time.Millisecond, func() error {
		i++
		post(s.t, url+"/v1/completions", map[string]any{"prompt": []int{900000 + i, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, "max_tokens": 1}, nil)
		if _, ok := s.recv(200 * time.Millisecond); !ok {
			return errors.New("the event subscription is not live")
		}
		return nil
	})
	s.collect(200 * time.Millisecond)
}

// collect reads messages until quiet for the given time.
func (s *sub) collect(quiet time.Duration) []msg {
	var out []msg
	for {
		m, ok := s.recv(quiet)
		if !ok {
			return out
		}
		out = append(out, m)
	}
}

// errorBody is vLLM's OpenAI error body.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// post sends a JSON body and decodes the JSON answer into out (if not nil).
// It returns the status code.
func post(t *testing.T, url string, body any, out any) int {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return postRaw(t, url, b, out)
}

func postRaw(t *testing.T, url string, body []byte, out any) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s: %v: %s", url, err, data)
		}
	}
	return resp.StatusCode
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return string(data)
}

// scraped is the value of the series of the family name with the labels
// given (summed when several match) on e's /metrics page.
func scraped(t *testing.T, e *enginesim.Engine, name string, labels map[string]string) float64 {
	t.Helper()
	return metrictest.Scraped(t, e.URL()+"/metrics", name, labels)
}

func ints(ids []uint32) []int {
	out := make([]int, len(ids))
	for i, v := range ids {
		out[i] = int(v)
	}
	return out
}
