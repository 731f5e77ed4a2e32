package workload

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"time"
)

// Trace replays a Mooncake-format trace as a plan: one JSON object a line
// with timestamp (ms), input_length, output_length and hash_ids (one per
// 512-token block of the prompt). Each hash id stands for a fixed run of
// 512 token ids (TraceTokens), so equal ids give equal tokens and prompts
// sharing leading ids share a prefix. Every record is its own one-request
// session: a token-id /v1/completions with max_tokens = output_length,
// sent at the record's timestamp (less the first's) divided by Options.Rate.
// The body is the bench's replay's, byte for byte: no ignore_eos, so the
// simulated engine stops at its natural length (16–63 tokens) when that
// is shorter than output_length. Requests sharing their first hash id form
// a conversation (numbered in order of first appearance), each request a
// turn; Prev is left to the driver, which continues the conversation's
// latest answered turn. Request.Tokens regenerates the prompt, so a
// driver need not keep the body.
//
// The seed draws three things, so that seeds are different workloads
// over the same trace:
//   - Subsample: each conversation is kept whole with probability Keep
//     (drawn in order of first appearance); a seeded plan so carries
//     ≈ Keep of the trace's load at rate 1 (Rate 1/Keep restores it).
//   - Arrival jitter: each kept record's time moves by a uniform
//     ±Jitter × the trace's mean gap (its span over its records less
//     one); the records are then re-sorted by the new times (stable), so
//     requests closer than the jitter may swap, and turns are numbered in
//     the new order.
//   - Prefix salt: the token run of a hash id depends on (hash id, seed)
//     (TraceTokens), so the prompts, and their cache keys, change while
//     the sharing structure stays.
//
// Seed 0 is the trace as it is: every record, at its own timestamp, with
// the token runs the bench has always sent.
//
// The trace is read from Path at every Plan; ReadTrace validates it. A
// record that would not fit Options.MaxModelLen fails the plan (skipping
// it would change the trace).
//
// Scale: the synthetic Mooncake release (FAST'25) is 3,993 records over
// 17 minutes (3.9 requests a second), mean input 15,325 tokens (p90
// 38.6K, max 191K), mean output 149; 45% of the requests have a first
// block no other request has. It is replayed unscaled: Limit takes a
// prefix of it.
//
// Zero fields take the defaults in brackets.
type Trace struct {
	Path      string // the JSONL file (required)
	Limit     int    // only the first Limit records [all]
	Engines   int    // [8]
	GPUBlocks int    // KV blocks per engine [65536: 1M tokens, the bench's]
	// Keep is the share of conversations a seeded plan keeps, in (0, 1]
	// [0.8].
	Keep float64
	// Jitter is the largest arrival shift, as a share of the mean gap
	// [0.5; a negative value means none].
	Jitter float64
}

// Trace limits: a hash id's block, a line, a prompt's blocks.
const (
	traceBlock     = 512
	traceMaxLine   = 4 << 20
	traceMaxBlocks = 1 << 12 // 2M tokens
)

// traceTokenKey is the second PCG word of every hash id's token run
// ("mooncake"), xored with the mixed seed.
const traceTokenKey = 0x6d6f6f6e63616b65

// TraceRecord is one line of a Mooncake trace.
type TraceRecord struct {
	Timestamp    int64    `json:"timestamp"` // ms since the trace's start
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

func (t Trace) withDefaults() Trace {
	t.Engines, t.GPUBlocks = cmp.Or(t.Engines, 8), cmp.Or(t.GPUBlocks, 65536)
	t.Keep, t.Jitter = cmp.Or(t.Keep, 0.8), cmp.Or(t.Jitter, 0.5)
	t.Jitter = max(t.Jitter, 0)
	return t
}

// Name is the scenario's name.
func (Trace) Name() string { return "trace" }

// Fleet is the fleet the replay is defined for, the bench's: 8 engines of
// 1M tokens each (the trace's working set is ≈ 2.5× the fleet's KV), with
// a context as long as the cache.
func (t Trace) Fleet() Fleet {
	t = t.withDefaults()
	return Fleet{Engines: t.Engines, GPUBlocks: t.GPUBlocks, MaxModelLen: (t.GPUBlocks - 1) * 16}
}

// SLO is 8 s: twice the cold prefill of the trace's p90 prompt (38.6K
// tokens at the default engine's 10,000 tokens a second ≈ 3.9 s), so an
// uncached request meets it with one such prefill queued ahead of it and
// sustained queueing does not.
func (Trace) SLO() time.Duration { return 8 * time.Second }

// Plan reads the trace and draws the replay for o.
func (t Trace) Plan(o Options) (Plan, error) {
	t = t.withDefaults()
	if err := checkOptions("trace", o); err != nil {
		return Plan{}, err
	}
	if t.Path == "" {
		return Plan{}, fmt.Errorf("trace: no trace file")
	}
	if !(t.Keep > 0 && t.Keep <= 1) || t.Limit < 0 {
		return Plan{}, fmt.Errorf("trace: keep %v (want (0, 1]), limit %d", t.Keep, t.Limit)
	}
	f, err := os.Open(t.Path)
	if err != nil {
		return Plan{}, fmt.Errorf("trace: %w", err)
	}
	recs, err := ReadTrace(f, t.Limit)
	f.Close()
	if err != nil {
		return Plan{}, err
	}
	return t.plan(recs, o)
}

// traceArrival is a kept record and its (jittered) time in ns from the
// trace's start.
type traceArrival struct {
	rec *TraceRecord
	at  int64
}

// plan draws the replay of recs for o.
func (t Trace) plan(recs []TraceRecord, o Options) (Plan, error) {
	for i, rec := range recs {
		if o.MaxModelLen > 0 && rec.InputLength+rec.OutputLength > o.MaxModelLen {
			return Plan{}, fmt.Errorf("trace record %d: %d prompt + %d output tokens exceed the engines' %d", i+1, rec.InputLength, rec.OutputLength, o.MaxModelLen)
		}
	}
	arrivals := make([]traceArrival, 0, len(recs))
	if o.Seed == 0 {
		for i := range recs {
			arrivals = append(arrivals, traceArrival{&recs[i], recs[i].Timestamp * int64(time.Millisecond)})
		}
	} else {
		rng := rand.New(rand.NewPCG(o.Seed, traceTokenKey))
		keep := map[uint64]bool{}
		for i := range recs {
			first := recs[i].HashIDs[0]
			k, seen := keep[first]
			if !seen {
				k = rng.Float64() < t.Keep
				keep[first] = k
			}
			if k {
				arrivals = append(arrivals, traceArrival{&recs[i], recs[i].Timestamp * int64(time.Millisecond)})
			}
		}
		if len(arrivals) == 0 {
			return Plan{}, fmt.Errorf("trace: seed %d keeps none of the %d records", o.Seed, len(recs))
		}
		var meanGap float64 // ns
		if n := len(recs); n > 1 {
			meanGap = float64(recs[n-1].Timestamp-recs[0].Timestamp) * float64(time.Millisecond) / float64(n-1)
		}
		for i := range arrivals {
			arrivals[i].at += int64((2*rng.Float64() - 1) * t.Jitter * meanGap)
		}
		slices.SortStableFunc(arrivals, func(x, y traceArrival) int { return cmp.Compare(x.at, y.at) })
	}
	p := Plan{Sessions: make([]Planned, 0, len(arrivals))}
	conv := map[uint64]int{} // first hash id → conversation
	turns := map[int]int{}   // conversation → requests so far
	t0, seed := arrivals[0].at, o.Seed
	for _, a := range arrivals {
		rec := a.rec
		id, ok := conv[rec.HashIDs[0]]
		if !ok {
			id = len(conv)
			conv[rec.HashIDs[0]] = id
		}
		turns[id]++
		turn := turns[id]
		p.Sessions = append(p.Sessions, Planned{Start: atRate(time.Duration(a.at-t0), o.Rate), Session: &single{build: func() Request {
			return Request{Path: "/v1/completions", Body: tokenCompletionBody(TraceTokens(nil, *rec, seed), rec.OutputLength),
				Conversation: id, Turn: turn, Tokens: func() []uint32 { return TraceTokens(nil, *rec, seed) }}
		}}})
	}
	return p, nil
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

// TraceTokens appends the prompt of rec under seed: the token runs of its
// hash ids, cut to input_length. A hash id's run is 512 ids in [1000,
// 151000) drawn from PCG(hash id, "mooncake" xor the mixed seed); the
// mixing keeps 0 at 0, so seed 0 gives the runs the bench has always sent.
func TraceTokens(dst []uint32, rec TraceRecord, seed uint64) []uint32 {
	key := uint64(traceTokenKey) ^ seed*0x9e3779b97f4a7c15
	end := len(dst) + rec.InputLength
	for _, h := range rec.HashIDs {
		g := rand.New(rand.NewPCG(h, key))
		for k := 0; k < traceBlock && len(dst) < end; k++ {
			dst = append(dst, 1000+uint32(g.IntN(150_000)))
		}
	}
	return dst
}
