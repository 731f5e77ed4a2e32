package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/sidecar"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

func engineConfig() enginesim.Config {
	cfg := enginesim.DefaultConfig()
	cfg.Host, cfg.Port = "127.0.0.1", 0
	cfg.NumGPUBlocks, cfg.MaxModelLen = 2048, 4096
	cfg.Sim.TimeScale = 0
	replay := "tcp://127.0.0.1:*"
	cfg.KVEvents.EnableKVCacheEvents = true
	cfg.KVEvents.Endpoint = "tcp://127.0.0.1:*"
	cfg.KVEvents.ReplayEndpoint = &replay
	return cfg
}

func startEngine(t *testing.T, cfg enginesim.Config) *enginesim.Process {
	t.Helper()
	p, err := enginesim.Start(cfg, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func sidecarConfig(e *enginesim.Engine) sidecar.Config {
	cfg := sidecar.DefaultConfig()
	cfg.EngineURL = e.URL()
	cfg.KVEvents = e.EventsEndpoint()
	cfg.Replay = e.ReplayEndpoint()
	cfg.AdminListen = "127.0.0.1:0"
	cfg.GRPCListen = "127.0.0.1:0"
	cfg.Capacity = 4096
	cfg.StartupTimeout = 10 * time.Second
	cfg.ReplayTimeout = time.Second
	return cfg
}

func startSidecar(t *testing.T, cfg sidecar.Config) *sidecar.Sidecar {
	t.Helper()
	s, err := sidecar.Start(context.Background(), cfg, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func post(t testing.TB, url string, body any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, data)
	}
}

func prompt(n, base int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = base + i
	}
	return p
}

// complete sends a token-id prompt.
func complete(t testing.TB, e *enginesim.Engine, p []int, salt string) {
	t.Helper()
	body := map[string]any{"prompt": p, "max_tokens": 1}
	if salt != "" {
		body["cache_salt"] = salt
	}
	post(t, e.URL()+"/v1/completions", body)
}

// converged waits until the sidecar holds exactly the engine's cached
// blocks and has applied every batch the engine published.
func converged(t testing.TB, s *sidecar.Sidecar, e *enginesim.Engine, rank int) sidecar.EndpointState {
	t.Helper()
	var st sidecar.EndpointState
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		es, err := e.Stats()
		if err != nil {
			t.Fatal(err)
		}
		st = s.State()[rank]
		if st.Blocks["GPU"] == es.CachedBlocks && (es.NextSeq == 0 || (st.LastSeq != nil && *st.LastSeq == es.NextSeq-1)) {
			return nil
		}
		return fmt.Errorf("sidecar %d blocks (last seq %v), engine %d blocks (next seq %d); state %+v",
			st.Blocks["GPU"], st.LastSeq, es.CachedBlocks, es.NextSeq, st)
	})
	return st
}

// deltaTaken waits until rank's GPU summary has a delta numbered past
// seq.
func deltaTaken(t *testing.T, s *sidecar.Sidecar, rank int, seq uint64) {
	t.Helper()
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := s.State()[rank]; st.DeltaSeq["GPU"] <= seq {
			return fmt.Errorf("no GPU delta past %d: %+v", seq, st)
		}
		return nil
	})
}

// batchFor encodes a batch storing one 16-token block whose hash and
// tokens derive from base.
func batchFor(t *testing.T, base uint32) []byte {
	ev := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(uint64(base))},
		TokenIDs: make([]uint32, 16), BlockSize: 16, Medium: "GPU"}
	for i := range ev.TokenIDs {
		ev.TokenIDs[i] = base + uint32(i)
	}
	p, err := kvevents.Encode(&kvevents.Batch{TS: 1, Events: []kvevents.Event{ev}}, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// TestFollowsEngine: the index counts exactly the engine's blocks, keyed as
// blockkey keys the same tokens and salt (different salts disjoint);
// eviction, reset and restart are reflected with new epochs.
func TestFollowsEngine(t *testing.T) {
	ecfg := engineConfig()
	ecfg.NumGPUBlocks, ecfg.MaxModelLen = 60, 512 // 59 usable blocks: eviction happens
	e := startEngine(t, ecfg).Engines()[0]
	s := startSidecar(t, sidecarConfig(e))
	complete(t, e, prompt(100, 1000), "")
	complete(t, e, prompt(100, 1000), "tenant-a")
	complete(t, e, prompt(100, 1000), "tenant-b")
	st := converged(t, s, e, 0)
	if st.Blocks["GPU"] != 18 || st.Identity.Model != "Qwen/Qwen3-0.6B" || st.Identity.BlockSize != 16 || st.Identity.TokenizerFingerprint == "" {
		t.Fatalf("state %+v", st)
	}
	base := fmt.Sprintf("http://%s", s.DebugAddr())
	for _, salt := range []string{"", "tenant-a", "tenant-b"} {
		toks := make([]uint32, 100)
		for i := range toks {
			toks[i] = uint32(1000 + i)
		}
		for _, k := range (&blockkey.Request{Tokens: toks, CacheSalt: salt}).AppendKeys(nil, "Qwen/Qwen3-0.6B", 16) {
			var out struct {
				Indexed      bool     `json:"indexed"`
				EngineHashes []uint64 `json:"engine_hashes"`
				May          bool     `json:"summary_may_contain"`
			}
			getJSON(t, base+"/debug/keys?canonical="+k.String(), &out)
			if !out.Indexed || len(out.EngineHashes) != 1 || !out.May {
				t.Fatalf("salt %q key %s: %+v", salt, k, out)
			}
		}
	}
	// Eviction: 4 × 25 new blocks through a 59-block cache.
	for i := 0; i < 4; i++ {
		complete(t, e, prompt(400, 10000*(i+2)), "")
	}
	st = converged(t, s, e, 0)
	if st.Index.RemovedBlocks == 0 {
		t.Fatal("no removals applied")
	}
	epoch := st.Epoch
	post(t, e.URL()+"/reset_prefix_cache", nil)
	st = converged(t, s, e, 0)
	if st.Blocks["GPU"] != 0 || st.Epoch != epoch+1 {
		t.Fatalf("after reset: %d blocks, epoch %d (was %d)", st.Blocks["GPU"], st.Epoch, epoch)
	}
	complete(t, e, prompt(64, 500), "")
	converged(t, s, e, 0)
	post(t, e.URL()+"/sim/restart", nil)
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if st := s.State()[0]; st.Epoch < epoch+2 || st.Blocks["GPU"] != 0 {
			var ev map[string][]map[string]any
			getJSON(t, fmt.Sprintf("http://%s/debug/events", s.DebugAddr()), &ev)
			return fmt.Errorf("restart not detected: %+v\nrecent events: %v", st, ev["0"][max(0, len(ev["0"])-6):])
		}
		return nil
	})
	complete(t, e, prompt(64, 600), "")
	st = converged(t, s, e, 0)
	if st.Blocks["GPU"] != 4 || st.Counters.Restarts < 1 || st.Partial {
		t.Fatalf("after restart: %+v", st)
	}
	var events map[string][]map[string]any
	getJSON(t, base+"/debug/events", &events)
	if len(events["0"]) == 0 {
		t.Fatal("no recent events")
	}
	if code := getJSON(t, base+"/readyz", nil); code != 200 {
		t.Fatalf("readyz %d", code)
	}
}

// TestLossRecovery: with 10% of batches dropped live, replay keeps the
// state exact; without replay the endpoint says it is partial.
func TestLossRecovery(t *testing.T) {
	for _, withReplay := range []bool{true, false} {
		t.Run(fmt.Sprint("replay=", withReplay), func(t *testing.T) {
			ecfg := engineConfig()
			ecfg.Sim.DropEventsPercent = 10
			ecfg.Sim.Seed = 7
			e := startEngine(t, ecfg).Engines()[0]
			cfg := sidecarConfig(e)
			if !withReplay {
				cfg.Replay = ""
			}
			s := startSidecar(t, cfg)
			for i := 0; i < 60; i++ {
				complete(t, e, prompt(40+i, 1000*(i+1)), "")
			}
			if withReplay {
				st := converged(t, s, e, 0)
				if st.Partial || st.Counters.Gaps == 0 {
					t.Fatalf("state %+v", st)
				}
				return
			}
			testnet.Await(t, 5*time.Second, 20*time.Millisecond, func() error {
				if st := s.State()[0]; !st.Partial {
					return fmt.Errorf("not partial: %+v", st)
				}
				return nil
			})
		})
	}
}

// TestLateStart: a sidecar started after the engine served requests
// catches up from the replay ring.
func TestLateStart(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	for i := 0; i < 5; i++ {
		complete(t, e, prompt(64, 1000*(i+1)), "")
	}
	s := startSidecar(t, sidecarConfig(e))
	if st := converged(t, s, e, 0); st.Blocks["GPU"] != 20 || st.Partial {
		t.Fatalf("late start: %+v", st)
	}
}

// TestDataParallelAndBindMode: two ranks in one engine process are two
// endpoints, each with its own keys; the SUBs bind and the engine's PUBs
// connect to them.
func TestDataParallelAndBindMode(t *testing.T) {
	ecfg := engineConfig()
	ecfg.DataParallelSize = 2
	ecfg.Port = testnet.FreePortPair(t)
	events := testnet.FreePortPair(t)
	replay := testnet.FreePortPair(t)
	ecfg.KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", events) // the PUBs connect
	rep := fmt.Sprintf("tcp://127.0.0.1:%d", replay)
	ecfg.KVEvents.ReplayEndpoint = &rep
	p := startEngine(t, ecfg)
	es := p.Engines()
	cfg := sidecarConfig(es[0])
	cfg.DataParallelSize = 2
	cfg.Bind = true
	cfg.KVEvents = ecfg.KVEvents.Endpoint
	cfg.Replay = rep
	cfg.P2PPort = 5710 // vLLM's default: rank r's side channel is on 5710+r
	s := startSidecar(t, cfg)
	// Wait for the engine's PUBs to reach the bound SUBs, then send work.
	for r := 0; r < 2; r++ {
		i := 0
		testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
			if s.State()[r].Blocks["GPU"] > 0 {
				return nil
			}
			complete(t, es[r], prompt(32, 100000*(r+1)+100*i), "")
			i++
			return fmt.Errorf("rank %d never received events (%d requests sent)", r, i)
		})
	}
	complete(t, es[0], prompt(48, 7000), "")
	complete(t, es[1], prompt(80, 9000), "")
	for r := 0; r < 2; r++ {
		st := converged(t, s, es[r], r)
		if st.Identity.Rank != r || st.Identity.Endpoint != es[r].URL() {
			t.Fatalf("rank %d identity %+v", r, st.Identity)
		}
		if want := fmt.Sprintf("127.0.0.1:%d", 5710+r); st.KVSource != want {
			t.Fatalf("rank %d advertises the KV source %q, want %q (the engine's host, --p2p-port plus the rank)", r, st.KVSource, want)
		}
	}
	base := fmt.Sprintf("http://%s", s.DebugAddr())
	toks := make([]uint32, 48)
	for i := range toks {
		toks[i] = uint32(7000 + i)
	}
	k := (&blockkey.Request{Tokens: toks}).AppendKeys(nil, "Qwen/Qwen3-0.6B", 16)[2]
	var in0, in1 struct{ Indexed bool }
	getJSON(t, base+"/debug/keys?rank=0&canonical="+k.String(), &in0)
	getJSON(t, base+"/debug/keys?rank=1&canonical="+k.String(), &in1)
	if !in0.Indexed || in1.Indexed {
		t.Fatalf("rank 0's key: rank0 %v rank1 %v", in0.Indexed, in1.Indexed)
	}
}

// TestMalformedInputIsCountedAndSkipped: hostile messages on the event
// socket (wrong frame count, bad seq frame, garbage payload, an orphan run)
// are counted and skipped; a good batch afterwards is applied.
func TestMalformedInputIsCountedAndSkipped(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	pub, err := zctx.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	_ = pub.SetLinger(0)
	if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := pub.GetLastEndpoint()
	cfg := sidecarConfig(e)
	cfg.KVEvents, cfg.Replay = ep, "" // our own publisher, no replay
	s := startSidecar(t, cfg)
	good := func(seq uint64, base uint32) [][]byte {
		return kvevents.Message{Topic: []byte{}, Seq: seq, Payload: batchFor(t, base)}.Frames()
	}
	// Wait for the subscription (slow joiner), then send the hostile input.
	polls := 0
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if s.State()[0].Blocks["GPU"] > 0 {
			return nil
		}
		if polls%10 == 0 { // the first time, then resent until it lands
			if _, err := pub.SendMessage(good(0, 100)); err != nil {
				t.Fatal(err)
			}
		}
		polls++
		return errors.New("the sidecar never received our publisher")
	})
	orphan := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(7)}, TokenIDs: make([]uint32, 16),
		BlockSize: 16, HasParent: true, ParentBlockHash: kvevents.IntHash(424242)}
	op, _ := kvevents.Encode(&kvevents.Batch{TS: 1, Events: []kvevents.Event{orphan}}, kvevents.LayoutMap)
	for _, frames := range [][][]byte{
		{[]byte("only"), []byte("two")},
		{{}, {1, 2, 3}, []byte{0x93}},
		{{}, kvevents.SeqBytes(1), []byte{0xdd, 0xff, 0xff, 0xff, 0xff}},
		{{}, kvevents.SeqBytes(2), op},
		good(3, 5000),
	} {
		if _, err := pub.SendMessage(frames); err != nil {
			t.Fatal(err)
		}
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if st := s.State()[0]; st.Blocks["GPU"] != 2 || st.Counters.Malformed != 3 || st.Index.UnresolvedParents != 1 {
			return fmt.Errorf("state %+v", st)
		}
		return nil
	})
	// /metrics counts them too: the three malformed messages, the orphan
	// run, and the stored runs applied (the good ones and the orphan).
	fams := metrictest.Families(t, "http://"+s.DebugAddr()+"/metrics")
	if got := metrictest.Sum(fams, "kvroute_sidecar_malformed_payloads_total", nil); got != 3 {
		t.Errorf("/metrics: %v malformed payloads, want 3", got)
	}
	if got := metrictest.Sum(fams, "kvroute_sidecar_unresolved_parents_total", nil); got != 1 {
		t.Errorf("/metrics: %v unresolved parents, want 1", got)
	}
	stored := map[string]string{"type": kvevents.TypeBlockStored.String()}
	if got := metrictest.Sum(fams, "kvroute_sidecar_events_total", stored); got < 3 {
		t.Errorf("/metrics: %v BlockStored events applied, want at least 3", got)
	}
}
