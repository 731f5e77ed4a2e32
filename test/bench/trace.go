package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Trace replays a Mooncake-format trace: one JSON object a line with
// timestamp (ms), input_length, output_length and hash_ids (one per
// 512-token block of the prompt). Each hash id stands for a fixed run of
// 512 token ids, so equal ids give equal tokens and prompts sharing leading
// ids share a prefix; prompts go as token ids to /v1/completions at their
// timestamps (times the client's time scale). Requests sharing their first
// block form a conversation, each continuing the latest answered one.
//
// Zero fields take the defaults in brackets.
type Trace struct {
	Path      string // the JSONL file (required)
	Engines   int    // [8]
	GPUBlocks int    // KV blocks per engine [65536: 1M tokens]
	Limit     int    // replay only the first Limit records [all]
	// Rate scales the trace's request rate: 0.5 sends at half the rate
	// (timestamps doubled), for a fleet smaller than the trace's [1].
	Rate float64
}

// Trace limits: a line, a prompt's blocks.
const (
	traceBlock     = 512
	traceMaxLine   = 4 << 20
	traceMaxBlocks = 1 << 12 // 2M tokens
)

// TraceRecord is one line of a Mooncake trace.
type TraceRecord struct {
	Timestamp    int64    `json:"timestamp"` // ms since the trace's start
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

func (t Trace) withDefaults() Trace {
	t.Engines, t.GPUBlocks = cmp.Or(t.Engines, 8), cmp.Or(t.GPUBlocks, 65536)
	t.Rate = cmp.Or(t.Rate, 1)
	return t
}

// Name is the scenario's name.
func (Trace) Name() string { return "trace" }

// Fleet is the fleet the replay runs on: context as long as the cache.
func (t Trace) Fleet() FleetConfig {
	t = t.withDefaults()
	return FleetConfig{Engines: t.Engines, GPUBlocks: t.GPUBlocks, MaxModelLen: (t.GPUBlocks - 1) * 16}
}

// ReadTrace parses a Mooncake trace, at most limit records (0: all). Each
// record is validated: non-negative, non-decreasing timestamps, a prompt
// of 1 to len(hash_ids)×512 tokens in at most 4,096 blocks, an output of
// at least one token; errors name the line.
func ReadTrace(r io.Reader, limit int) ([]TraceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), traceMaxLine)
	var out []TraceRecord
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		switch {
		case rec.Timestamp < 0 || (len(out) > 0 && rec.Timestamp < out[len(out)-1].Timestamp):
			return nil, fmt.Errorf("trace line %d: timestamp %d is negative or goes back", line, rec.Timestamp)
		case len(rec.HashIDs) == 0 || len(rec.HashIDs) > traceMaxBlocks:
			return nil, fmt.Errorf("trace line %d: %d hash_ids, want 1 to %d", line, len(rec.HashIDs), traceMaxBlocks)
		case rec.InputLength < 1 || rec.InputLength > len(rec.HashIDs)*traceBlock:
			return nil, fmt.Errorf("trace line %d: input_length %d does not fit %d blocks of %d", line, rec.InputLength, len(rec.HashIDs), traceBlock)
		case rec.OutputLength < 1:
			return nil, fmt.Errorf("trace line %d: output_length %d, want ≥ 1", line, rec.OutputLength)
		}
		out = append(out, rec)
		if limit > 0 && len(out) == limit {
			return out, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trace: no records")
	}
	return out, nil
}

// TraceTokens appends the prompt of rec: the token runs of its hash ids,
// cut to input_length.
func TraceTokens(dst []uint32, rec TraceRecord) []uint32 {
	for _, h := range rec.HashIDs {
		g := rand.New(rand.NewPCG(h, 0x6d6f6f6e63616b65))
		for k := 0; k < traceBlock && len(dst) < rec.InputLength; k++ {
			dst = append(dst, 1000+uint32(g.IntN(150_000)))
		}
	}
	return dst
}

// Run replays the trace.
func (t Trace) Run(ctx context.Context, c *Client, _ *rand.Rand) ([]Outcome, error) {
	t = t.withDefaults()
	if t.Path == "" {
		return nil, fmt.Errorf("trace: no trace file (--trace FILE)")
	}
	if t.Rate <= 0 {
		return nil, fmt.Errorf("trace: rate %v, want > 0", t.Rate)
	}
	f, err := os.Open(t.Path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	recs, err := ReadTrace(f, t.Limit)
	f.Close()
	if err != nil {
		return nil, err
	}
	for i, rec := range recs {
		if c.MaxModelLen > 0 && rec.InputLength+rec.OutputLength > c.MaxModelLen {
			return nil, fmt.Errorf("trace record %d: %d prompt + %d output tokens exceed the engines' %d", i+1, rec.InputLength, rec.OutputLength, c.MaxModelLen)
		}
	}
	var mu sync.Mutex
	var outcomes []Outcome
	conv := map[uint64]int{}  // first hash id → conversation
	last := map[int]string{}  // conversation → its latest answered request's endpoint
	lastTurn := map[int]int{} // … and turn
	turns := map[int]int{}    // conversation → requests so far
	start, t0 := time.Now(), recs[0].Timestamp
	var wg sync.WaitGroup
	for _, rec := range recs {
		at := time.Duration(float64(rec.Timestamp-t0) / t.Rate * float64(time.Millisecond))
		if !c.WaitUntil(ctx, start.Add(c.Wall(at))) {
			break
		}
		id, ok := conv[rec.HashIDs[0]]
		if !ok {
			id = len(conv)
			conv[rec.HashIDs[0]] = id
		}
		mu.Lock()
		turns[id]++
		turn, prev := turns[id], last[id]
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := completionBody(TraceTokens(nil, rec), rec.OutputLength)
			o := c.CompletionsRaw(ctx, body)
			o.Conversation, o.Turn, o.PrevEndpoint = id, turn, prev
			o.Body, o.Tokens = nil, func() []uint32 { return TraceTokens(nil, rec) } // regenerated: far smaller
			mu.Lock()
			defer mu.Unlock()
			outcomes = append(outcomes, o)
			if o.Err == nil && turn > lastTurn[id] {
				last[id], lastTurn[id] = o.Endpoint, turn
			}
		}()
	}
	wg.Wait()
	slices.SortStableFunc(outcomes, func(x, y Outcome) int { return x.Start.Compare(y.Start) })
	return outcomes, ctx.Err()
}

// completionBody is a streaming token-id completion, encoded by hand (a
// long prompt is most of the body).
func completionBody(tokens []uint32, maxTokens int) []byte {
	b := make([]byte, 0, 16+7*len(tokens)+128)
	b = append(b, `{"model":"Qwen/Qwen3-0.6B","prompt":[`...)
	for i, tok := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(tok), 10)
	}
	b = append(b, `],"max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	return append(b, `,"stream":true,"stream_options":{"include_usage":true}}`...)
}
