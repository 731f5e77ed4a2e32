package enginesim_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
	"github.com/kvroute/kvroute/test/vectors"
)

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completion struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

func cached(u usage) int {
	if u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

// storedHashes returns the BlockStored hashes in msgs, in order.
func storedHashes(msgs []msg) []uint64 {
	var out []uint64
	for _, m := range msgs {
		for _, ev := range m.batch.Events {
			if ev.Type == kvevents.TypeBlockStored {
				for _, h := range ev.BlockHashes {
					out = append(out, h.Int)
				}
			}
		}
	}
	return out
}

// TestEmitsVLLMHashes: with PYTHONHASHSEED=42 and block size 16, the 400
// token ids of the llm-d captures make the engine publish exactly vLLM's 25
// block hashes over ZeroMQ, without and with LoRA "Alice".
func TestEmitsVLLMHashes(t *testing.T) {
	for _, name := range []string{"base", "lora"} {
		t.Run(name, func(t *testing.T) {
			load := vectors.Base
			if name == "lora" {
				load = vectors.LoRA
			}
			c, err := load()
			if err != nil {
				t.Fatal(err)
			}
			s := newSub(t, true, "tcp://127.0.0.1:*")
			cfg := testConfig()
			cfg.HashSeed = c.HashSeed
			cfg.Model = c.ModelName
			withEvents(&cfg, s.endpoint)
			model := c.ModelName
			if c.LoraName != nil {
				cfg.EnableLoRA = true
				cfg.LoRAModules = []enginesim.LoRAModule{{Name: *c.LoraName, Path: c.LoraPath}}
				model = *c.LoraName
			}
			e := start(t, cfg).Engines()[0]
			s.waitLive(e.URL())
			var out completion
			if code := post(t, e.URL()+"/v1/completions", map[string]any{"model": model, "prompt": ints(c.TokenIDs), "max_tokens": 1}, &out); code != 200 {
				t.Fatalf("status %d", code)
			}
			msgs := s.collect(300 * time.Millisecond)
			got := storedHashes(msgs)
			if len(got) != 25 {
				t.Fatalf("published %d block hashes, want 25: %v", len(got), got)
			}
			for i := range got {
				if got[i] != c.BlockHashes[i] {
					t.Fatalf("block %d: %d, vLLM published %d", i, got[i], c.BlockHashes[i])
				}
			}
			ev := msgs[0].batch.Events[0]
			if ev.HasParent || ev.BlockSize != 16 || ev.Medium != "GPU" || !ev.GroupIdx.Valid || ev.KVCacheSpecKind != "full_attention" {
				t.Fatalf("event fields %+v", ev)
			}
			if c.LoraName != nil && (ev.LoraName != "Alice" || ev.ExtraKeys[3][0] != "Alice" || ev.LoraID.Value != 1) {
				t.Fatalf("LoRA fields: name %q extra %v id %+v", ev.LoraName, ev.ExtraKeys[3], ev.LoraID)
			}
			if msgs[0].topic != "kv@test@model" || !msgs[0].batch.DataParallelRank.Valid || msgs[0].batch.DataParallelRank.Value != 0 {
				t.Fatalf("topic %q rank %+v", msgs[0].topic, msgs[0].batch.DataParallelRank)
			}
		})
	}
}

// TestCachedTokens: a repeat reports cached_tokens, capped at len−1 and
// rounded down to a block; without the flag the details are omitted.
func TestCachedTokens(t *testing.T) {
	for _, details := range []bool{true, false} {
		cfg := testConfig()
		cfg.EnablePromptTokensDetails = details
		e := start(t, cfg).Engines()[0]
		prompt := make([]int, 100)
		for i := range prompt {
			prompt[i] = 5000 + i
		}
		var first, second completion
		post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2}, &first)
		post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2}, &second)
		if first.Usage.PromptTokensDetails != nil {
			t.Fatalf("first request reports details %+v", first.Usage.PromptTokensDetails)
		}
		if details && cached(second.Usage) != 96 {
			t.Fatalf("repeat cached %d tokens, want 96", cached(second.Usage))
		}
		if !details && second.Usage.PromptTokensDetails != nil {
			t.Fatal("details reported without --enable-prompt-tokens-details")
		}
		fams := metrictest.Families(t, e.URL()+"/metrics")
		hits, queries := metrictest.Sum(fams, "vllm:prefix_cache_hits_total", nil), metrictest.Sum(fams, "vllm:prefix_cache_queries_total", nil)
		if hits != 96 || queries != 200 {
			t.Fatalf("prefix cache metrics: hits %v queries %v", hits, queries)
		}
	}
}

// TestEvictionResetRestart: pressure evicts (BlockRemoved), reset clears
// (AllBlocksCleared), restart starts seq from 0 with an empty cache.
func TestEvictionResetRestart(t *testing.T) {
	s := newSub(t, true, "tcp://127.0.0.1:*")
	cfg := testConfig()
	cfg.NumGPUBlocks = 40 // 39 usable blocks of 16
	cfg.MaxModelLen = 512
	withEvents(&cfg, s.endpoint)
	e := start(t, cfg).Engines()[0]
	s.waitLive(e.URL())

	prompt := func(base int) []int {
		p := make([]int, 320) // 20 blocks
		for i := range p {
			p[i] = base + i
		}
		return p
	}
	for _, base := range []int{10000, 20000, 30000} {
		post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt(base), "max_tokens": 1}, nil)
	}
	removed := 0
	var lastSeq uint64
	for _, m := range s.collect(300 * time.Millisecond) {
		lastSeq = m.seq
		for _, ev := range m.batch.Events {
			if ev.Type == kvevents.TypeBlockRemoved {
				removed += len(ev.BlockHashes)
			}
		}
	}
	if removed == 0 {
		t.Fatal("no BlockRemoved under cache pressure")
	}

	if code := post(t, e.URL()+"/reset_prefix_cache", nil, nil); code != 200 {
		t.Fatalf("reset: %d", code)
	}
	msgs := s.collect(300 * time.Millisecond)
	if len(msgs) != 1 || len(msgs[0].batch.Events) != 1 || msgs[0].batch.Events[0].Type != kvevents.TypeAllBlocksCleared || msgs[0].seq != lastSeq+1 {
		t.Fatalf("after reset: %+v", msgs)
	}
	var c completion
	post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt(30000), "max_tokens": 1}, &c)
	if cached(c.Usage) != 0 {
		t.Fatalf("hit %d after reset", cached(c.Usage))
	}
	s.collect(200 * time.Millisecond)

	before := scraped(t, e, "process_start_time_seconds", nil)
	if code := post(t, e.URL()+"/sim/restart", nil, nil); code != 200 {
		t.Fatalf("restart: %d", code)
	}
	after := scraped(t, e, "process_start_time_seconds", nil)
	if before == after {
		t.Fatal("start time unchanged by restart")
	}
	post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt(30000), "max_tokens": 1}, &c)
	if cached(c.Usage) != 0 {
		t.Fatalf("the cache survived the restart: %d tokens hit", cached(c.Usage))
	}
	// The restarted publisher connects anew; its first live seq is 0.
	var first msg
	i := 0
	testnet.Await(t, 10*time.Second, time.Millisecond, func() error {
		post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt(40000 + 1000*i), "max_tokens": 1}, &c)
		i++
		m, ok := s.recv(300 * time.Millisecond)
		if !ok {
			return errors.New("no events after restart")
		}
		first = m
		return nil
	})
	if first.seq > 2 { // slow-joiner losses aside, seq restarted near 0
		t.Fatalf("first seq after restart %d", first.seq)
	}
	st, err := e.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.NextSeq > 10 {
		t.Fatalf("seq counter %d after restart", st.NextSeq)
	}
}

// TestReplay: batches dropped live by the fault switch come back through
// the replay ROUTER, in both reply layouts, ending with the end marker.
func TestReplay(t *testing.T) {
	for _, layout := range []kvevents.ReplayLayout{kvevents.ReplayWithTopic, kvevents.ReplayLegacy} {
		t.Run(layout.String(), func(t *testing.T) {
			cfg := testConfig()
			withEvents(&cfg, "tcp://127.0.0.1:*")
			cfg.Sim.ReplayLayout = layout
			e := start(t, cfg).Engines()[0]
			s := newSub(t, false, e.EventsEndpoint())
			s.waitLive(e.URL())
			st, err := e.Stats()
			if err != nil {
				t.Fatal(err)
			}
			first := st.NextSeq
			if err := e.SetEventFaults(100, 0); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 5; i++ {
				p := make([]int, 48)
				for j := range p {
					p[j] = 100*i + j
				}
				post(t, e.URL()+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 1}, nil)
			}
			if _, ok := s.recv(300 * time.Millisecond); ok {
				t.Fatal("a dropped batch was published live")
			}
			if v := scraped(t, e, "kvroute_engine_kv_event_batches_dropped_total", map[string]string{"engine": "0", "model_name": "Qwen/Qwen3-0.6B", "reason": "fault"}); v != 5 {
				t.Fatalf("drops counted %v, want 5", v)
			}
			got := replay(t, e.ReplayEndpoint(), first+2, layout)
			if len(got) != 3 || got[0] != first+2 || got[2] != first+4 {
				t.Fatalf("replayed seqs %v, want [%d %d %d]", got, first+2, first+3, first+4)
			}
		})
	}
}

// replay asks a ROUTER for batches from start and returns their seqs.
func replay(t *testing.T, endpoint string, start uint64, layout kvevents.ReplayLayout) []uint64 {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Term()
	d, err := ctx.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetRcvtimeo(5 * time.Second)
	if err := d.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SendMessage(kvevents.ReplayRequest(start)); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for i := 0; i < 10000; i++ {
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		f, err := kvevents.ParseReplayReply(frames)
		if err != nil {
			t.Fatal(err)
		}
		if f.Layout != layout {
			t.Fatalf("reply layout %v, want %v", f.Layout, layout)
		}
		if f.End {
			return seqs
		}
		if _, err := kvevents.Decode(f.Payload); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, f.Seq)
	}
	t.Fatal("replay never ended")
	return nil
}

// TestDataParallelRanks: each rank has its own HTTP port (port+r), event
// port (+r) and replay port (+r), and stamps its rank on its batches.
func TestDataParallelRanks(t *testing.T) {
	base := testnet.FreePortPair(t)
	s0 := newSub(t, true, fmt.Sprintf("tcp://127.0.0.1:%d", base))
	s1 := newSub(t, true, fmt.Sprintf("tcp://127.0.0.1:%d", base+1))
	cfg := testConfig()
	cfg.DataParallelSize = 2
	cfg.Port = testnet.FreePortPair(t)
	withEvents(&cfg, fmt.Sprintf("tcp://127.0.0.1:%d", base))
	replayBase := testnet.FreePortPair(t)
	replayEP := fmt.Sprintf("tcp://127.0.0.1:%d", replayBase)
	cfg.KVEvents.ReplayEndpoint = &replayEP
	p := start(t, cfg)
	es := p.Engines()
	if len(es) != 2 {
		t.Fatalf("%d ranks", len(es))
	}
	if port(t, es[1].Addr()) != port(t, es[0].Addr())+1 || port(t, es[0].Addr()) != cfg.Port {
		t.Fatalf("HTTP ports %s %s", es[0].Addr(), es[1].Addr())
	}
	if es[1].EventsEndpoint() != fmt.Sprintf("tcp://127.0.0.1:%d", base+1) {
		t.Fatalf("rank 1 events on %s", es[1].EventsEndpoint())
	}
	if es[0].ReplayEndpoint() != replayEP || es[1].ReplayEndpoint() != fmt.Sprintf("tcp://127.0.0.1:%d", replayBase+1) {
		t.Fatalf("replay endpoints %s %s", es[0].ReplayEndpoint(), es[1].ReplayEndpoint())
	}
	for r, s := range []*sub{s0, s1} {
		s.waitLive(es[r].URL())
		post(t, es[r].URL()+"/v1/completions", map[string]any{"prompt": "a prompt long enough to fill one block of sixteen tokens for sure, rank " + strconv.Itoa(r), "max_tokens": 1}, nil)
		msgs := s.collect(300 * time.Millisecond)
		if len(msgs) == 0 {
			t.Fatalf("rank %d published nothing", r)
		}
		for _, m := range msgs {
			if m.batch.DataParallelRank.Value != int64(r) {
				t.Fatalf("rank %d batch stamped %d", r, m.batch.DataParallelRank.Value)
			}
		}
		if got := replay(t, es[r].ReplayEndpoint(), 0, kvevents.ReplayWithTopic); len(got) == 0 {
			t.Fatalf("rank %d replay ring empty", r)
		}
	}
}

func port(t *testing.T, addr string) int {
	u, err := url.Parse("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}

// TestArrayLayoutAndBoundPub: older-vLLM array events, with the PUB binding
// (wildcard-style endpoint) and a SUB connecting, as a sidecar does by default.
func TestArrayLayoutAndBoundPub(t *testing.T) {
	cfg := testConfig()
	withEvents(&cfg, "tcp://127.0.0.1:*")
	cfg.Sim.EventLayout = kvevents.LayoutArray
	e := start(t, cfg).Engines()[0]
	if !strings.HasPrefix(e.EventsEndpoint(), "tcp://127.0.0.1:") || strings.HasSuffix(e.EventsEndpoint(), "*") {
		t.Fatalf("bound endpoint %q", e.EventsEndpoint())
	}
	s := newSub(t, false, e.EventsEndpoint())
	s.waitLive(e.URL())
	post(t, e.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("array layout ", 20), "max_tokens": 1}, nil)
	msgs := s.collect(300 * time.Millisecond)
	if len(msgs) == 0 || msgs[0].batch.Layout != kvevents.LayoutArray {
		t.Fatalf("messages %+v", msgs)
	}
}

// TestChunkedPrefillAndDecodeBlocks: a prompt longer than the step budget
// is prefilled in chunks; decode blocks are published as they fill.
func TestChunkedPrefillAndDecodeBlocks(t *testing.T) {
	s := newSub(t, true, "tcp://127.0.0.1:*")
	cfg := testConfig()
	cfg.MaxNumBatchedTokens = 64
	withEvents(&cfg, s.endpoint)
	e := start(t, cfg).Engines()[0]
	s.waitLive(e.URL())
	p := make([]int, 200) // 12 full blocks, 4 chunks of ≤ 64
	for i := range p {
		p[i] = 70000 + i
	}
	var c completion
	post(t, e.URL()+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 40, "ignore_eos": true}, &c)
	if c.Usage.CompletionTokens != 40 || c.Choices[0].FinishReason != "length" {
		t.Fatalf("usage %+v finish %q", c.Usage, c.Choices[0].FinishReason)
	}
	msgs := s.collect(300 * time.Millisecond)
	// prompt 200 + 39 computed output tokens = 239 → 14 full blocks.
	if got := len(storedHashes(msgs)); got != 14 {
		t.Fatalf("%d blocks stored, want 14", got)
	}
	if len(msgs) < 5 {
		t.Fatalf("%d batches: prefill was not chunked", len(msgs))
	}
}

// TestErrors: vLLM-style error bodies and status codes, each counted.
func TestErrors(t *testing.T) {
	cfg := testConfig()
	cfg.MaxModelLen = 64
	cfg.NumGPUBlocks = 64
	e := start(t, cfg).Engines()[0]
	long := make([]int, 65)
	cases := []struct {
		path string
		body string
		code int
		want string
	}{
		{"/v1/chat/completions", `{"messages": [`, 400, "Invalid JSON"},
		{"/v1/completions", `{"prompt": ` + fmt.Sprint(ints32(long)) + `}`, 400, "maximum context length is 64"},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": 100}`, 400, "maximum context length"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"cache_salt":""}`, 400, "cache_salt"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,"continue_final_message":true}`, 400, "Cannot set both"},
		{"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, "The model `nope` does not exist."},
		{"/v1/completions", `{"model":"nope","prompt":"x"}`, 404, "does not exist"},
		{"/v1/responses", `{"input":"hi","previous_response_id":"resp_1"}`, 400, "previous_response_id"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "not supported"},
		{"/v1/completions", `{"prompt": [16844008]}`, 400, "out of vocabulary"},
		{"/detokenize", `{"tokens": [16844008]}`, 400, "out of vocabulary"},
		{"/tokenize", `{}`, 400, "tokenize needs"},
	}
	for _, c := range cases {
		var body errorBody
		code := postRaw(t, e.URL()+c.path, []byte(c.body), &body)
		if code != c.code || body.Error.Code != c.code || !strings.Contains(body.Error.Message, c.want) || body.Error.Type == "" {
			t.Errorf("%s %s: %d %+v, want %d containing %q", c.path, c.body, code, body.Error, c.code, c.want)
		}
	}
	// A route vLLM does not register (Responses render without
	// VLLM_ENABLE_SCALE_OUT_ENDPOINTS, any unknown path) is FastAPI's 404.
	for _, path := range []string{"/v1/responses/render", "/v1/nope"} {
		var detail map[string]any
		if code := postRaw(t, e.URL()+path, []byte(`{"input":"hi"}`), &detail); code != 404 || len(detail) != 1 || detail["detail"] != "Not Found" {
			t.Errorf("%s: %d %v, want 404 {\"detail\":\"Not Found\"}", path, code, detail)
		}
	}
	// A served path with another method is FastAPI's 405, with Allow; a
	// route the runner does not register stays a 404 for every method.
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodGet, "/v1/chat/completions", "POST"},
		{http.MethodPost, "/v1/models", "GET, HEAD"},
		{http.MethodDelete, "/tokenize", "POST"},
		{http.MethodGet, "/v1/embeddings", ""},
	} {
		req, _ := http.NewRequest(tc.method, e.URL()+tc.path, strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var detail map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&detail)
		resp.Body.Close()
		want, status := "Method Not Allowed", http.StatusMethodNotAllowed
		if tc.allow == "" {
			want, status = "Not Found", http.StatusNotFound
		}
		if resp.StatusCode != status || resp.Header.Get("Allow") != tc.allow || detail["detail"] != want {
			t.Errorf("%s %s: %d, Allow %q, %v", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), detail)
		}
	}
	if v := scraped(t, e, "kvroute_engine_http_errors_total", map[string]string{"engine": "0", "model_name": "Qwen/Qwen3-0.6B", "path": "/v1/chat/completions", "status": "400"}); v != 4 {
		t.Errorf("chat 400s counted %v, want 4", v)
	}
	// Still serving after all that.
	var c completion
	if code := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": "still alive", "max_tokens": 2}, &c); code != 200 {
		t.Fatalf("status %d after errors", code)
	}
}

func ints32(v []int) string {
	s := make([]string, len(v))
	for i := range v {
		s[i] = strconv.Itoa(v[i] + 1000)
	}
	return "[" + strings.Join(s, ",") + "]"
}

// TestRenderTokenizeDetokenize: render endpoints return the tokens the
// engine hashes and echo cache_salt; /tokenize agrees; a conversation's
// render is a prefix of its continuation's; /detokenize reverses.
func TestRenderTokenizeDetokenize(t *testing.T) {
	cfg := testConfig()
	cfg.EnableScaleOutEndpoints = true
	e := start(t, cfg).Engines()[0]
	conv := []map[string]any{
		{"role": "system", "content": "You are terse."},
		{"role": "user", "content": "What is a KV cache?"},
	}
	var r1 struct {
		TokenIDs  []uint32 `json:"token_ids"`
		CacheSalt *string  `json:"cache_salt"`
		Model     string   `json:"model"`
	}
	if code := post(t, e.URL()+"/v1/chat/completions/render", map[string]any{"messages": conv, "cache_salt": "tenant-a"}, &r1); code != 200 {
		t.Fatalf("render: %d", code)
	}
	if r1.CacheSalt == nil || *r1.CacheSalt != "tenant-a" || len(r1.TokenIDs) == 0 || r1.Model != "Qwen/Qwen3-0.6B" {
		t.Fatalf("render %+v", r1)
	}
	var tok struct {
		Count     int      `json:"count"`
		Tokens    []uint32 `json:"tokens"`
		MaxLen    int      `json:"max_model_len"`
		TokenStrs []string `json:"token_strs"`
	}
	post(t, e.URL()+"/tokenize", map[string]any{"messages": conv, "cache_salt": "ignored", "return_token_strs": true}, &tok)
	if fmt.Sprint(tok.Tokens) != fmt.Sprint(r1.TokenIDs) || tok.Count != len(tok.Tokens) || tok.MaxLen != 8192 || len(tok.TokenStrs) != tok.Count {
		t.Fatalf("tokenize %+v differs from render %v", tok, r1.TokenIDs)
	}
	longer := append(append([]map[string]any{}, conv...),
		map[string]any{"role": "assistant", "content": "Stored attention keys and values."},
		map[string]any{"role": "user", "content": "Why does it help?"})
	var r2 struct {
		TokenIDs []uint32 `json:"token_ids"`
	}
	post(t, e.URL()+"/v1/chat/completions/render", map[string]any{"messages": longer}, &r2)
	if len(r2.TokenIDs) <= len(r1.TokenIDs) || fmt.Sprint(r2.TokenIDs[:len(r1.TokenIDs)]) != fmt.Sprint(r1.TokenIDs) {
		t.Fatal("a conversation's render is not a prefix of its continuation's")
	}
	// The Responses form of the same conversation renders the same tokens.
	var rr struct {
		TokenIDs  []uint32 `json:"token_ids"`
		CacheSalt *string  `json:"cache_salt"`
	}
	post(t, e.URL()+"/v1/responses/render", map[string]any{"instructions": "You are terse.", "input": "What is a KV cache?", "cache_salt": "s"}, &rr)
	if fmt.Sprint(rr.TokenIDs) != fmt.Sprint(r1.TokenIDs) || rr.CacheSalt == nil || *rr.CacheSalt != "s" {
		t.Fatalf("responses render %v, chat render %v", rr.TokenIDs, r1.TokenIDs)
	}
	post(t, e.URL()+"/tokenize", map[string]any{"instructions": "You are terse.", "input": "What is a KV cache?"}, &tok)
	if fmt.Sprint(tok.Tokens) != fmt.Sprint(r1.TokenIDs) {
		t.Fatal("tokenize of Responses input differs")
	}
	var cr []struct {
		TokenIDs []uint32 `json:"token_ids"`
	}
	post(t, e.URL()+"/v1/completions/render", map[string]any{"prompt": []string{"one", "two words"}}, &cr)
	if len(cr) != 2 || len(cr[1].TokenIDs) == 0 {
		t.Fatalf("completions render %+v", cr)
	}
	var de struct {
		Prompt string `json:"prompt"`
	}
	post(t, e.URL()+"/tokenize", map[string]any{"prompt": "Hello, world — déjà vu"}, &tok)
	post(t, e.URL()+"/detokenize", map[string]any{"tokens": tok.Tokens}, &de)
	if de.Prompt != "Hello, world — déjà vu" {
		t.Fatalf("detokenize gave %q", de.Prompt)
	}
}

// TestServiceEndpoints: models (with LoRA), health, version, metrics names.
func TestServiceEndpoints(t *testing.T) {
	cfg := testConfig()
	cfg.ServedModelNames = []string{"my-model"}
	cfg.EnableLoRA = true
	cfg.LoRAModules = []enginesim.LoRAModule{{Name: "Alice", Path: "/adapters/alice"}}
	e := start(t, cfg).Engines()[0]
	models := get(t, e.URL()+"/v1/models")
	// vLLM's ModelList: base cards carry max_model_len, adapter cards a
	// parent and a null max_model_len; every card one ModelPermission.
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID         string           `json:"id"`
			Object     string           `json:"object"`
			Created    int64            `json:"created"`
			OwnedBy    string           `json:"owned_by"`
			Root       string           `json:"root"`
			Parent     *string          `json:"parent"`
			MaxLen     *int             `json:"max_model_len"`
			Permission []map[string]any `json:"permission"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(models), &list); err != nil || list.Object != "list" || len(list.Data) != 2 {
		t.Fatalf("models %s: %v", models, err)
	}
	base, lora := list.Data[0], list.Data[1]
	if base.ID != "my-model" || base.Object != "model" || base.OwnedBy != "vllm" || base.Root != cfg.Model || base.Parent != nil ||
		base.MaxLen == nil || *base.MaxLen != cfg.MaxModelLen || base.Created == 0 {
		t.Errorf("base card %s", models)
	}
	if lora.ID != "Alice" || lora.Root != "/adapters/alice" || lora.Parent == nil || *lora.Parent != "my-model" || lora.MaxLen != nil {
		t.Errorf("adapter card %s", models)
	}
	for _, c := range list.Data {
		if len(c.Permission) != 1 || c.Permission[0]["object"] != "model_permission" || c.Permission[0]["allow_sampling"] != true ||
			c.Permission[0]["organization"] != "*" || !strings.HasPrefix(fmt.Sprint(c.Permission[0]["id"]), "modelperm-") {
			t.Errorf("%s permission %v", c.ID, c.Permission)
		}
	}
	if r, err := http.Get(e.URL() + "/health"); err != nil || r.StatusCode != 200 {
		t.Fatalf("health %v %v", r, err)
	}
	if !strings.Contains(get(t, e.URL()+"/version"), "version") {
		t.Fatal("version")
	}
	fams := metrictest.Families(t, e.URL()+"/metrics")
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
		"vllm:generation_tokens_total", "vllm:time_to_first_token_seconds", "process_start_time_seconds",
	} {
		if metrictest.Series(fams, name, nil) != 1 {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if metrictest.Series(fams, "vllm:cache_config_info", map[string]string{
		"block_size": "16", "num_gpu_blocks": "4096", "prefix_caching_hash_algo": "sha256_cbor"}) != 1 {
		t.Error("/metrics lacks vllm:cache_config_info with the cache's block size, blocks and hash")
	}
	// A LoRA request is served under the adapter's name.
	var c struct {
		Model string `json:"model"`
	}
	post(t, e.URL()+"/v1/completions", map[string]any{"model": "Alice", "prompt": "hi", "max_tokens": 1}, &c)
	if c.Model != "Alice" {
		t.Fatalf("model %q", c.Model)
	}
}

func TestConfigValidation(t *testing.T) {
	bad := map[string]func(*enginesim.Config){
		"hash algo":     func(c *enginesim.Config) { c.HashAlgo = "sha256" },
		"runner":        func(c *enginesim.Config) { c.Runner = "draft" },
		"block size":    func(c *enginesim.Config) { c.BlockSize = 0 },
		"lora w/o flag": func(c *enginesim.Config) { c.LoRAModules = []enginesim.LoRAModule{{"a", "b"}} },
		"time scale":    func(c *enginesim.Config) { c.Sim.TimeScale = -1 },
		"drop":          func(c *enginesim.Config) { c.Sim.DropEventsPercent = 101 },
		"dp ipc": func(c *enginesim.Config) {
			c.DataParallelSize = 2
			c.KVEvents.EnableKVCacheEvents = true
			c.KVEvents.Endpoint = "ipc:///tmp/x"
		},
		"cache smaller than context": func(c *enginesim.Config) { c.NumGPUBlocks = 10; c.MaxModelLen = 1000 },
	}
	for name, f := range bad {
		cfg := testConfig()
		f(&cfg)
		if _, err := enginesim.Start(cfg, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for _, s := range []string{`{"enable_kv_cache_events":true,"publisher":"kafka"}`, `{"nope":1}`, `{`} {
		if _, err := enginesim.ParseKVEventsConfig(s); err == nil {
			t.Errorf("ParseKVEventsConfig(%s) accepted", s)
		}
	}
	c, err := enginesim.ParseKVEventsConfig(`{"enable_kv_cache_events":true,"publisher":"null"}`)
	if err != nil || c.Enabled() {
		t.Errorf("null publisher: %+v %v", c, err)
	}
	for _, s := range []string{"a", "=b", "a=", `{"path":"x"}`} {
		if _, err := enginesim.ParseLoRAModule(s); err == nil {
			t.Errorf("ParseLoRAModule(%q) accepted", s)
		}
	}
	if m, err := enginesim.ParseLoRAModule(`{"name":"a","path":"p"}`); err != nil || m.Name != "a" {
		t.Errorf("JSON LoRA module: %+v %v", m, err)
	}
}

// TestEventFaultSwitchesAtRunTime: /sim/faults delays batches, then drops
// them (still replayable), then turns both off.
func TestEventFaultSwitchesAtRunTime(t *testing.T) {
	cfg := testConfig()
	withEvents(&cfg, "tcp://127.0.0.1:*")
	e := start(t, cfg).Engines()[0]
	s := newSub(t, false, e.EventsEndpoint())
	s.waitLive(e.URL())
	body := func(i int) map[string]any {
		p := make([]int, 32)
		for j := range p {
			p[j] = 50000 + 100*i + j
		}
		return map[string]any{"prompt": p, "max_tokens": 1}
	}
	if code := post(t, e.URL()+"/sim/faults", map[string]any{"delay_events_ms": 400}, nil); code != 200 {
		t.Fatalf("faults: %d", code)
	}
	sent := time.Now()
	post(t, e.URL()+"/v1/completions", body(1), nil)
	m, ok := s.recv(3 * time.Second)
	if !ok {
		t.Fatal("delayed batch never arrived")
	}
	if waited := time.Since(sent); waited < 350*time.Millisecond {
		t.Fatalf("batch arrived after %v, delay was 400ms", waited)
	}
	post(t, e.URL()+"/sim/faults", map[string]any{"drop_events_pct": 100}, nil)
	post(t, e.URL()+"/v1/completions", body(2), nil)
	if _, ok := s.recv(300 * time.Millisecond); ok {
		t.Fatal("batch published while dropping")
	}
	if got := replay(t, e.ReplayEndpoint(), m.seq+1, kvevents.ReplayWithTopic); len(got) != 1 || got[0] != m.seq+1 {
		t.Fatalf("dropped batch not replayable: %v", got)
	}
	post(t, e.URL()+"/sim/faults", map[string]any{}, nil)
	post(t, e.URL()+"/v1/completions", body(3), nil)
	if m3, ok := s.recv(2 * time.Second); !ok || m3.seq != m.seq+2 {
		t.Fatalf("after clearing faults: %+v %v", m3, ok)
	}
	if code := post(t, e.URL()+"/sim/faults", map[string]any{"drop_events_pct": 150}, nil); code != 400 {
		t.Fatalf("bad fault accepted: %d", code)
	}
}

// TestBatchedPromptsAndBudgets: each prompt of a batch keeps its own token
// ids and its own output budget; max_tokens cannot overflow the context check.
func TestBatchedPromptsAndBudgets(t *testing.T) {
	cfg := testConfig()
	cfg.MaxModelLen = 64
	cfg.NumGPUBlocks = 64
	e := start(t, cfg).Engines()[0]
	var rendered []struct {
		TokenIDs       []uint32       `json:"token_ids"`
		SamplingParams map[string]int `json:"sampling_params"`
	}
	post(t, e.URL()+"/v1/completions/render", map[string]any{"prompt": [][]int{{1000, 1001, 1002, 1003}, {2000, 2001}}}, &rendered)
	if len(rendered) != 2 || fmt.Sprint(rendered[0].TokenIDs) != "[1000 1001 1002 1003]" || fmt.Sprint(rendered[1].TokenIDs) != "[2000 2001]" {
		t.Fatalf("rendered %+v", rendered)
	}
	// Without max_tokens each prompt gets vLLM's default of 16, capped by
	// what its own context leaves.
	long := make([]int, 56)
	for i := range long {
		long[i] = 3000 + i
	}
	post(t, e.URL()+"/v1/completions/render", map[string]any{"prompt": []any{[]int{1000}, long}}, &rendered)
	if rendered[0].SamplingParams["max_tokens"] != 16 || rendered[1].SamplingParams["max_tokens"] != 8 {
		t.Fatalf("budgets %v %v", rendered[0].SamplingParams, rendered[1].SamplingParams)
	}
	var c completion
	if code := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": []any{[]int{1000}, long}, "ignore_eos": true}, &c); code != 200 {
		t.Fatalf("status %d", code)
	}
	if c.Usage.CompletionTokens != 16+8 {
		t.Fatalf("generated %d tokens, want 24", c.Usage.CompletionTokens)
	}
	if code := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": int64(1) << 62}, nil); code != 400 {
		t.Fatalf("huge max_tokens: %d", code)
	}
	many := make([][]int, 1025)
	for i := range many {
		many[i] = []int{1000}
	}
	if code := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": many}, nil); code != 400 {
		t.Fatalf("1025 prompts: %d", code)
	}
}

// TestStartFailsCleanly: a busy HTTP port makes Start fail promptly.
func TestStartFailsCleanly(t *testing.T) {
	first := start(t, testConfig()).Engines()[0]
	cfg := testConfig()
	cfg.Port = port(t, first.Addr())
	done := make(chan error, 1)
	go func() {
		p, err := enginesim.Start(cfg, nil)
		if err == nil {
			p.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Start succeeded on a busy port")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start hung on a busy port")
	}
}

// TestPreemptionUnderPressure: concurrent long generations on a small
// cache preempt, recompute and still finish; the metric counts it.
func TestPreemptionUnderPressure(t *testing.T) {
	cfg := testConfig()
	cfg.NumGPUBlocks = 20 // 19 usable blocks of 16
	cfg.MaxModelLen = 160
	cfg.Sim.TimeScale = 0.05 // steps take wall time, so the 8 requests overlap (at 0 they may run one by one)
	e := start(t, cfg).Engines()[0]
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			p := make([]int, 40)
			for j := range p {
				p[j] = 1000 + 100*i + j
			}
			var c completion
			if code := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 100, "ignore_eos": true}, &c); code != 200 || c.Usage.CompletionTokens != 100 {
				errs <- fmt.Sprintf("request %d: status %d, %d tokens", i, code, c.Usage.CompletionTokens)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if v := scraped(t, e, "vllm:num_preemptions_total", nil); v == 0 {
		t.Fatal("no preemption under pressure")
	}
}

// TestSaltOnTheWire: a salted request publishes the salt in extra_keys[0]
// of its run, and reset_running_requests resets even while busy.
func TestSaltOnTheWire(t *testing.T) {
	s := newSub(t, true, "tcp://127.0.0.1:*")
	cfg := testConfig()
	withEvents(&cfg, s.endpoint)
	e := start(t, cfg).Engines()[0]
	s.waitLive(e.URL())
	post(t, e.URL()+"/v1/completions", map[string]any{"prompt": strings.Repeat("salted tokens ", 12), "max_tokens": 1, "cache_salt": "tenant-z"}, nil)
	msgs := s.collect(300 * time.Millisecond)
	if len(msgs) == 0 {
		t.Fatal("no events")
	}
	ev := msgs[0].batch.Events[0]
	if ev.HasParent || len(ev.ExtraKeys) == 0 || len(ev.ExtraKeys[0]) != 1 || ev.ExtraKeys[0][0] != "tenant-z" {
		t.Fatalf("extra keys %v", ev.ExtraKeys)
	}
	for i := 1; i < len(ev.ExtraKeys); i++ {
		if ev.ExtraKeys[i] != nil {
			t.Fatalf("salt on block %d too", i)
		}
	}
	if code := post(t, e.URL()+"/reset_prefix_cache?reset_running_requests=true", nil, nil); code != 200 {
		t.Fatalf("reset: %d", code)
	}
	if msgs := s.collect(300 * time.Millisecond); len(msgs) != 1 || msgs[0].batch.Events[0].Type != kvevents.TypeAllBlocksCleared {
		t.Fatalf("after reset: %+v", msgs)
	}
}

// TestSchedulingPolicyPriorityField: the body's priority is vLLM's: 0 by
// default; a non-zero one under fcfs (the default) is refused with vLLM's
// 400, on every generate endpoint, streamed or not; under
// --scheduling-policy priority it is accepted. (The order it sets is the
// scheduler's, TestPriorityOrder in package sched.)
func TestSchedulingPolicyPriorityField(t *testing.T) {
	bodies := map[string]string{
		"/v1/chat/completions": `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2%s}`,
		"/v1/completions":      `{"prompt":"hi","max_tokens":2%s}`,
		"/v1/responses":        `{"input":"hi","max_output_tokens":2%s}`,
	}
	for _, policy := range []string{"fcfs", "priority"} {
		cfg := testConfig()
		cfg.SchedulingPolicy = policy
		e := start(t, cfg).Engines()[0]
		for path, body := range bodies {
			for _, extra := range []string{"", `,"priority":0`, `,"priority":-2`, `,"priority":3,"stream":true`} {
				b := fmt.Sprintf(body, extra)
				var eb errorBody
				refused := policy == "fcfs" && extra != "" && extra != `,"priority":0`
				var out any
				if refused {
					out = &eb
				}
				code := postRaw(t, e.URL()+path, []byte(b), out)
				switch {
				case refused && (code != 400 || !strings.Contains(eb.Error.Message, "but Priority scheduling is not enabled.") || eb.Error.Type != "BadRequestError"):
					t.Errorf("%s %s %s: %d %+v, want vLLM's 400", policy, path, b, code, eb.Error)
				case !refused && code != 200:
					t.Errorf("%s %s %s: %d %+v, want 200", policy, path, b, code, eb.Error)
				}
			}
		}
	}
	cfg := testConfig()
	cfg.SchedulingPolicy = "lottery"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--scheduling-policy") {
		t.Fatalf("policy lottery: %v", err)
	}
}
