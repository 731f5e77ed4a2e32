package enginesim_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim"
)

var update = flag.Bool("update", false, "rewrite the golden file (testdata/workload.golden)")

const (
	goldenFile  = "testdata/workload.golden"
	goldenTopic = "kv@golden" // the batches' topic, written only when another
)

// TestWorkloadGolden pins the engine's wire behaviour, byte for byte: the
// answers to a fixed, seeded workload (completions, chat and responses,
// streamed and not, shared prefixes, eviction, chunked prefill, prefix-cache
// resets), the metrics it leaves behind, and every KV-event batch it
// published, read back through the replay socket. The golden was generated
// from the engine before its scheduler became a pure core (commit 428e830,
// with -update); the engine built on the core must answer the same. Since,
// only new series were added to it: vllm:request_queue_time_seconds and
// vllm:request_prefill_time_seconds (every line before and after them
// unchanged; the workload's requests go one at a time, so every queue time
// is 0 and the prefill times are the TTFTs), then
// kvroute_engine_kv_transfer_params_ignored_total (all 0: the workload
// sends no kv_transfer_params).
//
// The requests go one at a time, each answer read to its end before the
// next, so the engine's steps do not depend on timing. Ids, timestamps and
// the start time are normalised away; the event batches' timestamps are
// dropped and their token ids kept as a count and a hash.
//
// -update rewrites the golden from the engine at hand: that re-pins the
// engine as it is now, so it is for a deliberate change of wire behaviour
// only (the original came from this file run with -update in a worktree at
// 428e830).
func TestWorkloadGolden(t *testing.T) {
	cfg := enginesim.DefaultConfig()
	cfg.Host = "127.0.0.1"
	cfg.Port = 0
	cfg.BlockSize = 16
	cfg.NumGPUBlocks = 120
	cfg.MaxModelLen = 1024
	cfg.MaxNumBatchedTokens = 256
	cfg.EnablePromptTokensDetails = true
	cfg.Sim.TimeScale = 0
	replayAt := "tcp://127.0.0.1:*"
	cfg.KVEvents = enginesim.DefaultKVEventsConfig()
	cfg.KVEvents.EnableKVCacheEvents = true
	cfg.KVEvents.Endpoint = "tcp://127.0.0.1:*"
	cfg.KVEvents.ReplayEndpoint = &replayAt
	cfg.KVEvents.Topic = goldenTopic
	p, err := enginesim.Start(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e := p.Engines()[0]
	client := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)

	var out bytes.Buffer
	for i, req := range goldenWorkload() {
		status, body := goldenPost(t, client, e.URL()+req.path, req.body)
		fmt.Fprintf(&out, "### %d POST %s %d\n", i, req.path, status)
		if req.body != nil {
			fmt.Fprintf(&out, "> %s\n", goldenRequestSummary(req.body))
		}
		out.Write(goldenNormalise(body))
		if len(body) > 0 && body[len(body)-1] != '\n' {
			out.WriteByte('\n')
		}
	}

	out.WriteString("### metrics\n")
	_, metrics := goldenGet(t, client, e.URL()+"/metrics")
	for _, line := range strings.Split(string(metrics), "\n") {
		if !strings.HasPrefix(line, "vllm:") && !strings.HasPrefix(line, "kvroute_engine_") {
			continue
		}
		if strings.Contains(line, "start_time") {
			continue
		}
		out.WriteString(line + "\n")
	}

	out.WriteString("### events\n")
	for _, b := range goldenReplay(t, e.ReplayEndpoint()) {
		out.WriteString(b + "\n")
	}

	got := out.Bytes()
	if *update {
		if err := os.MkdirAll(filepath.Dir(goldenFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < max(len(gl), len(wl)); i++ {
			g, w := "<end>", "<end>"
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				section := ""
				for j := min(i, len(wl)-1); j >= 0; j-- {
					if strings.HasPrefix(wl[j], "### ") {
						section = wl[j]
						break
					}
				}
				t.Fatalf("%s: first difference at line %d (%d lines, golden %d), in %q:\n got: %.600s\nwant: %.600s\n(for the rest, run with -update in a scratch worktree and diff)",
					goldenFile, i+1, len(gl), len(wl), section, g, w)
			}
		}
	}
}

type goldenRequest struct {
	path string
	body map[string]any // nil: an empty body
}

// goldenWorkload is the fixed workload: shared prefixes with random
// suffixes, over all three generative APIs, streamed and not.
func goldenWorkload() []goldenRequest {
	rng := rand.New(rand.NewPCG(20260428, 0x5eed))
	// Token-id prefixes for /v1/completions, of 40–400 tokens.
	var tokenPrefixes [][]int
	for _, n := range []int{40, 130, 260, 400} {
		p := make([]int, n)
		for j := range p {
			p[j] = 1000 + rng.IntN(50000)
		}
		tokenPrefixes = append(tokenPrefixes, p)
	}
	words := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
		"kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"}
	text := func(n int) string {
		w := make([]string, n)
		for i := range w {
			w[i] = words[rng.IntN(len(words))]
		}
		return strings.Join(w, " ")
	}
	textPrefixes := []string{"You are a terse assistant. " + text(30), "Answer in French. " + text(90), text(200)}
	salts := []string{"tenant-a", "tenant-b"}

	var reqs []goldenRequest
	const n = 100
	for i := 0; i < n; i++ {
		if i == 35 || i == 70 {
			reqs = append(reqs, goldenRequest{path: "/reset_prefix_cache"})
		}
		body := map[string]any{}
		stream := rng.IntN(5) < 2
		maxTokens := []int{1, 5, 20, 0}[rng.IntN(4)] // 0: none
		if maxTokens > 0 && rng.IntN(3) == 0 {
			body["ignore_eos"] = true
		}
		if rng.IntN(5) == 0 {
			body["cache_salt"] = salts[rng.IntN(len(salts))]
		}
		if stream {
			body["stream"] = true
		}
		var path string
		switch rng.IntN(3) {
		case 0:
			path = "/v1/completions"
			prompt := append([]int(nil), tokenPrefixes[rng.IntN(len(tokenPrefixes))]...)
			for k := rng.IntN(60); k > 0; k-- {
				prompt = append(prompt, 1000+rng.IntN(50000))
			}
			body["prompt"] = prompt
			if maxTokens > 0 {
				body["max_tokens"] = maxTokens
			}
			if stream && rng.IntN(2) == 0 {
				body["stream_options"] = map[string]any{"include_usage": true}
			}
		case 1:
			path = "/v1/chat/completions"
			msgs := []map[string]any{
				{"role": "system", "content": textPrefixes[rng.IntN(len(textPrefixes))]},
				{"role": "user", "content": text(1 + rng.IntN(25))},
			}
			body["messages"] = msgs
			if maxTokens > 0 {
				body["max_tokens"] = maxTokens
			}
			if stream && rng.IntN(2) == 0 {
				body["stream_options"] = map[string]any{"include_usage": true}
			}
		default:
			path = "/v1/responses"
			// The shared prefix goes in the input (a response echoes its
			// instructions, which would bloat the golden), short
			// instructions only now and then.
			if rng.IntN(4) == 0 {
				body["instructions"] = text(3)
			}
			body["input"] = []map[string]any{
				{"role": "system", "content": textPrefixes[rng.IntN(len(textPrefixes))]},
				{"role": "user", "content": text(1 + rng.IntN(25))},
			}
			if maxTokens > 0 {
				body["max_output_tokens"] = maxTokens
			}
		}
		reqs = append(reqs, goldenRequest{path: path, body: body})
	}
	return reqs
}

// goldenRequestSummary names a request's shape (its prompt as a count and
// a hash: the workload is in the code, the golden need not repeat it).
func goldenRequestSummary(body map[string]any) string {
	var parts []string
	for _, k := range []string{"stream", "stream_options", "max_tokens", "max_output_tokens", "ignore_eos", "cache_salt"} {
		if v, ok := body[k]; ok {
			b, _ := json.Marshal(v)
			parts = append(parts, k+"="+string(b))
		}
	}
	for _, k := range []string{"prompt", "messages", "instructions", "input"} {
		if v, ok := body[k]; ok {
			b, _ := json.Marshal(v)
			h := fnv.New32a()
			h.Write(b)
			parts = append(parts, fmt.Sprintf("%s=%dB:%08x", k, len(b), h.Sum32()))
		}
	}
	return strings.Join(parts, " ")
}

var (
	goldenTimeField = regexp.MustCompile(`"(created|created_at)":\s*[0-9.]+`)
	goldenIDField   = regexp.MustCompile(`"id":\s*"[^"]*"`)
	goldenIDs       = regexp.MustCompile(`\b(chatcmpl-|cmpl-|resp_|msg_)[0-9A-Za-z]+`)
)

// goldenNormalise replaces ids and timestamps in an answer.
func goldenNormalise(b []byte) []byte {
	b = goldenTimeField.ReplaceAll(b, []byte(`"$1":0`))
	b = goldenIDField.ReplaceAll(b, []byte(`"id":"ID"`))
	return goldenIDs.ReplaceAll(b, []byte(`${1}ID`))
}

func goldenPost(t *testing.T, c *http.Client, url string, body map[string]any) (int, []byte) {
	t.Helper()
	var rd io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	resp, err := c.Post(url, "application/json", rd)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

func goldenGet(t *testing.T, c *http.Client, url string) (int, []byte) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

// goldenReplay asks the replay ROUTER for every batch from seq 0 and
// renders each on one line.
func goldenReplay(t *testing.T, endpoint string) []string {
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
	if err := d.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := d.SetRcvtimeo(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SendMessage(kvevents.ReplayRequest(0)); err != nil {
		t.Fatal(err)
	}
	var lines []string
	next := uint64(0)
	for i := 0; i < 100_000; i++ {
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		f, err := kvevents.ParseReplayReply(frames)
		if err != nil {
			t.Fatal(err)
		}
		if f.End {
			return lines
		}
		if f.Seq != next {
			t.Fatalf("replay: seq %d, want %d (the ring lost batches?)", f.Seq, next)
		}
		next++
		b, err := kvevents.Decode(f.Payload)
		if err != nil {
			t.Fatalf("replay seq %d: %v", f.Seq, err)
		}
		lines = append(lines, goldenBatch(f, b))
	}
	t.Fatal("replay never ended")
	return nil
}

// goldenBatch renders a batch without its timestamp.
func goldenBatch(f kvevents.ReplayFrame, b *kvevents.Batch) string {
	var s strings.Builder
	fmt.Fprintf(&s, "%d %s", f.Seq, b.Layout)
	if string(f.Topic) != goldenTopic {
		fmt.Fprintf(&s, " topic=%q", f.Topic)
	}
	if b.DataParallelRank.Valid {
		fmt.Fprintf(&s, " dp=%d", b.DataParallelRank.Value)
	}
	for _, ev := range b.Events {
		s.WriteString(" | ")
		if ev.Type == kvevents.TypeUnknown {
			s.WriteString("?" + ev.TypeName)
		} else {
			s.WriteString(ev.Type.String())
		}
		if len(ev.BlockHashes) > 0 {
			hs := make([]string, len(ev.BlockHashes))
			for i, h := range ev.BlockHashes {
				hs[i] = h.String()
			}
			s.WriteString(" h=" + strings.Join(hs, ","))
		}
		if ev.HasParent {
			s.WriteString(" p=" + ev.ParentBlockHash.String())
		}
		if ev.TokenIDs != nil {
			h := fnv.New32a()
			var w [4]byte
			for _, id := range ev.TokenIDs {
				w[0], w[1], w[2], w[3] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
				h.Write(w[:])
			}
			fmt.Fprintf(&s, " tok=%d:%08x", len(ev.TokenIDs), h.Sum32())
		}
		if ev.BlockSize != 0 {
			s.WriteString(" bs=" + strconv.Itoa(ev.BlockSize))
		}
		for _, kv := range []struct {
			k string
			v kvevents.OptInt
		}{{"lora_id", ev.LoraID}, {"group", ev.GroupIdx}, {"sw", ev.KVCacheSpecSlidingWindow}} {
			if kv.v.Valid {
				fmt.Fprintf(&s, " %s=%d", kv.k, kv.v.Value)
			}
		}
		for _, kv := range [][2]string{{"m", ev.Medium}, {"lora", ev.LoraName}, {"spec", ev.KVCacheSpecKind},
			{"loc", ev.Locality}, {"own", ev.Ownership}, {"sess", ev.SessionID}} {
			if kv[1] != "" {
				s.WriteString(" " + kv[0] + "=" + kv[1])
			}
		}
		if ev.ExtraKeys != nil {
			fmt.Fprintf(&s, " ek=%v", ev.ExtraKeys)
		}
	}
	return s.String()
}
