package enginesim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// sink collects the batches an engine hands its EventSink.
type sink struct {
	mu      sync.Mutex
	batches []kvevents.Batch
}

func (s *sink) put(b kvevents.Batch) {
	s.mu.Lock()
	s.batches = append(s.batches, b)
	s.mu.Unlock()
}

func (s *sink) all() []kvevents.Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.batches)
}

// types lists a batch's event types.
func types(b kvevents.Batch) []kvevents.EventType {
	var out []kvevents.EventType
	for _, ev := range b.Events {
		out = append(out, ev.Type)
	}
	return out
}

// TestEventSinkWithoutZMQ: with KV events over ZMQ off, the sink alone
// gets every batch, in order, each before the answer of the step that
// made it: a prompt's stored blocks (its token ids, the rank), none for a
// repeat that stores nothing new, AllBlocksCleared for a reset.
func TestEventSinkWithoutZMQ(t *testing.T) {
	var got sink
	cfg := testConfig()
	cfg.EventSink = got.put
	e := start(t, cfg).Engines()[0]
	if e.EventsEndpoint() != "" {
		t.Fatalf("events endpoint %q with ZMQ off", e.EventsEndpoint())
	}
	prompt := make([]int, 100) // six full blocks
	for i := range prompt {
		prompt[i] = 7000 + i
	}
	var c completion
	post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}, &c)
	batches := got.all() // no wait: the batch goes out before the answer
	if len(batches) != 1 || !slices.Equal(types(batches[0]), []kvevents.EventType{kvevents.TypeBlockStored}) {
		t.Fatalf("after one prompt: %+v", batches)
	}
	ev := batches[0].Events[0]
	if len(ev.BlockHashes) != 6 || !slices.Equal(ints(ev.TokenIDs), prompt[:96]) || batches[0].DataParallelRank != kvevents.Some(0) {
		t.Fatalf("stored %d blocks, tokens %v, rank %+v", len(ev.BlockHashes), ev.TokenIDs, batches[0].DataParallelRank)
	}
	post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}, &c)
	if cached(c.Usage) != 96 || len(got.all()) != 1 {
		t.Fatalf("repeat: %d cached, %d batches", cached(c.Usage), len(got.all()))
	}
	if code := post(t, e.URL()+"/reset_prefix_cache", nil, nil); code != 200 {
		t.Fatalf("reset: %d", code)
	}
	batches = got.all()
	if len(batches) != 2 || !slices.Equal(types(batches[1]), []kvevents.EventType{kvevents.TypeAllBlocksCleared}) {
		t.Fatalf("after the reset: %+v", batches)
	}
}

// TestEventSinkWithZMQ: with KV events over ZMQ on, the sink gets the
// same batches as the subscriber, in the same order.
func TestEventSinkWithZMQ(t *testing.T) {
	var got sink
	cfg := testConfig()
	withEvents(&cfg, "tcp://127.0.0.1:*")
	cfg.EventSink = got.put
	e := start(t, cfg).Engines()[0]
	s := newSub(t, false, e.EventsEndpoint())
	s.waitLive(e.URL())
	mark := len(got.all())
	for i := 0; i < 5; i++ {
		p := make([]int, 40)
		for j := range p {
			p[j] = 20000 + 100*i + j
		}
		post(t, e.URL()+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 3}, nil)
	}
	live := s.collect(300 * time.Millisecond)
	sunk := got.all()[mark:]
	if len(live) != 5 || len(sunk) != 5 {
		t.Fatalf("%d batches live, %d in the sink; want 5 each", len(live), len(sunk))
	}
	for i, m := range live {
		// The sink's batch as the wire carries it.
		payload, err := kvevents.Encode(&sunk[i], cfg.Sim.EventLayout)
		if err != nil {
			t.Fatal(err)
		}
		b, err := kvevents.Decode(payload)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(b, m.batch) {
			t.Fatalf("batch %d: sink %+v, live %+v", i, b, m.batch)
		}
	}
}

// TestLoad: Engine.Load reports the load figures the core reports, as
// /metrics does: a running request and the blocks it holds, then nothing
// once its client has gone away.
func TestLoad(t *testing.T) {
	cfg := testConfig()
	cfg.Sim.TimeScale = 1 // real time: the request below runs for seconds
	e := start(t, cfg).Engines()[0]
	if l := e.Load(); l.Running != 0 || l.Waiting != 0 || l.KVUsage != 0 {
		t.Fatalf("idle engine: %+v", l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, _ := json.Marshal(map[string]any{"prompt": "a long answer please", "max_tokens": 400, "ignore_eos": true, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/completions", bytes.NewReader(body))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	// Running, holding blocks, and the same figures on /metrics.
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		l := e.Load()
		if l.Running != 1 || l.Waiting != 0 || l.KVUsage <= 0 {
			return fmt.Errorf("load %+v, want one request running", l)
		}
		return sameAsMetrics(e, l)
	})
	cancel() // the client goes away: the request leaves, its blocks freed
	<-done
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		l := e.Load()
		if l.Running != 0 || l.Waiting != 0 || l.KVUsage != 0 {
			return fmt.Errorf("load %+v after the client left, want none", l)
		}
		return sameAsMetrics(e, l)
	})
}

// sameAsMetrics compares l with the gauges on e's /metrics page.
func sameAsMetrics(e *enginesim.Engine, l enginesim.Load) error {
	fams, err := metrictest.Fetch(e.URL() + "/metrics")
	if err != nil {
		return err
	}
	m := enginesim.Load{
		Running: int(metrictest.Sum(fams, "vllm:num_requests_running", nil)),
		Waiting: int(metrictest.Sum(fams, "vllm:num_requests_waiting", nil)),
		KVUsage: metrictest.Sum(fams, "vllm:kv_cache_usage_perc", nil),
	}
	if m != l {
		return fmt.Errorf("Load %+v, /metrics %+v", l, m)
	}
	return nil
}
