package workload_test

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/workload"
)

// traceBlock is a hash id's tokens.
const traceBlock = 512

var updateTrace = flag.Bool("update-trace", false, "rewrite testdata/trace-small.jsonl from genTrace")

// smallTrace is the test trace, written by genTrace.
const smallTrace = "testdata/trace-small.jsonl"

// genTrace makes a small Mooncake-like trace: 300 records at Poisson
// arrivals (mean gap 250 ms) of prompts of 1–16 blocks; about half the
// records start a conversation of their own, a third of those go on for
// 1–6 more requests, each extending its conversation's hash ids by a new
// block; no two records have the same hash ids.
func genTrace() []byte {
	rng := rand.New(rand.NewPCG(34, 6))
	type conv struct {
		ids  []uint64
		left int
	}
	var open []*conv
	var b bytes.Buffer
	var ts int64
	next := uint64(100)
	newIDs := func(n int) []uint64 {
		ids := make([]uint64, n)
		for i := range ids {
			ids[i], next = next, next+1
		}
		return ids
	}
	for i := 0; i < 300; i++ {
		ts += int64(rng.ExpFloat64() * 250)
		var ids []uint64
		if len(open) > 0 && rng.IntN(100) < 50 {
			k := rng.IntN(len(open))
			c := open[k]
			c.ids = append(c.ids, newIDs(1)...)
			ids = slices.Clone(c.ids)
			if c.left--; c.left == 0 || len(c.ids) == 16 {
				open = slices.Delete(open, k, k+1)
			}
		} else {
			ids = newIDs(1 + rng.IntN(8))
			if rng.IntN(3) == 0 {
				open = append(open, &conv{ids: slices.Clone(ids), left: 1 + rng.IntN(6)})
			}
		}
		var idText []string
		for _, id := range ids {
			idText = append(idText, strconv.FormatUint(id, 10))
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n",
			ts, (len(ids)-1)*traceBlock+1+rng.IntN(traceBlock), 1+rng.IntN(300), strings.Join(idText, ", "))
	}
	return b.Bytes()
}

// TestTraceTestdata: the test trace is genTrace's (go test -update-trace
// rewrites it).
func TestTraceTestdata(t *testing.T) {
	want := genTrace()
	if *updateTrace {
		if err := os.WriteFile(smallTrace, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(smallTrace)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s is not genTrace's (%v): go test -run TestTraceTestdata -update-trace", smallTrace, err)
	}
}

func readSmallTrace(t *testing.T) []workload.TraceRecord {
	t.Helper()
	b, err := os.ReadFile(smallTrace)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := workload.ReadTrace(bytes.NewReader(b), 0)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// benchTraceTokens is the bench's token runs before seeds (test/bench's
// TraceTokens): seed 0 must give exactly these.
func benchTraceTokens(dst []uint32, rec workload.TraceRecord) []uint32 {
	for _, h := range rec.HashIDs {
		g := rand.New(rand.NewPCG(h, 0x6d6f6f6e63616b65))
		for k := 0; k < traceBlock && len(dst) < rec.InputLength; k++ {
			dst = append(dst, 1000+uint32(g.IntN(150_000)))
		}
	}
	return dst
}

// benchBody is the bench's token-id completion body.
func benchBody(tokens []uint32, maxTokens int) []byte {
	b := []byte(`{"model":"Qwen/Qwen3-0.6B","prompt":[`)
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

// tokensKey identifies a prompt by its tokens.
func tokensKey(toks []uint32) string {
	return fmt.Sprint(len(toks), chainedBlockKeys("", append(slices.Clone(toks), make([]uint32, simBlockTokens)...)))
}

// TestTraceSeedZero: seed 0 is the trace as it is — every record, at its
// timestamp, with the bench's token runs and body — and Rate 2 halves the
// offsets.
func TestTraceSeedZero(t *testing.T) {
	recs := readSmallTrace(t)
	sc := workload.Trace{Path: smallTrace}
	p, err := sc.Plan(workload.Options{Seed: 0, Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := sc.Plan(workload.Options{Seed: 0, Rate: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sessions) != len(recs) || len(p2.Sessions) != len(recs) {
		t.Fatalf("%d and %d sessions for %d records", len(p.Sessions), len(p2.Sessions), len(recs))
	}
	reqs := drivePlan(t, p, false)
	conv, turns := map[uint64]int{}, map[int]int{}
	for i, rec := range recs {
		if want := time.Duration(rec.Timestamp-recs[0].Timestamp) * time.Millisecond; p.Sessions[i].Start != want || p2.Sessions[i].Start != want/2 {
			t.Fatalf("record %d: start %v at rate 1, %v at rate 2; want %v", i, p.Sessions[i].Start, p2.Sessions[i].Start, want)
		}
		r := reqs[i]
		toks := benchTraceTokens(nil, rec)
		if r.session != i || r.req.Path != "/v1/completions" || !bytes.Equal(r.req.Body, benchBody(toks, rec.OutputLength)) ||
			!slices.Equal(r.req.Tokens(), toks) || !slices.Equal(workload.TraceTokens(nil, rec, 0), toks) {
			t.Fatalf("record %d: not the bench's prompt and body", i)
		}
		id, ok := conv[rec.HashIDs[0]]
		if !ok {
			id = len(conv)
			conv[rec.HashIDs[0]] = id
		}
		turns[id]++
		if r.req.Conversation != id || r.req.Turn != turns[id] || r.req.Prev != "" || r.wait != 0 {
			t.Fatalf("record %d: conversation %d turn %d prev %q wait %v; want %d, %d", i, r.req.Conversation, r.req.Turn, r.req.Prev, r.wait, id, turns[id])
		}
	}
	// The reference body, spelled out.
	if got, want := string(benchBody([]uint32{1001, 2002}, 7)),
		`{"model":"Qwen/Qwen3-0.6B","prompt":[1001,2002],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`; got != want {
		t.Fatalf("body %s", got)
	}
}

// TestTraceSeeds: a seed keeps about Keep of the conversations, whole;
// moves each arrival by at most Jitter × the mean gap; salts the token
// runs (sharing kept); and another seed is another workload.
func TestTraceSeeds(t *testing.T) {
	recs := readSmallTrace(t)
	meanGap := time.Duration(recs[len(recs)-1].Timestamp-recs[0].Timestamp) * time.Millisecond / time.Duration(len(recs)-1)
	convSize := map[uint64]int{}
	for _, rec := range recs {
		convSize[rec.HashIDs[0]]++
	}
	sc := workload.Trace{Path: smallTrace}
	digests := map[[32]byte]uint64{}
	keptSets, startSets := map[string]uint64{}, map[string]uint64{}
	for _, seed := range []uint64{1, 2, 3} {
		p, err := sc.Plan(workload.Options{Seed: seed, Rate: 1})
		if err != nil {
			t.Fatal(err)
		}
		byTokens := map[string]int{} // the records' prompts under seed
		for i, rec := range recs {
			byTokens[tokensKey(workload.TraceTokens(nil, rec, seed))] = i
		}
		reqs := drivePlan(t, p, false)
		kept := map[uint64]int{}
		var first = -1
		var shifts []time.Duration
		for k, r := range reqs {
			i, ok := byTokens[tokensKey(r.req.Tokens())]
			if !ok {
				t.Fatalf("seed %d: request %d is no record's prompt under the seed", seed, k)
			}
			rec := recs[i]
			if bytes.Equal(r.req.Body, benchBody(benchTraceTokens(nil, rec), rec.OutputLength)) {
				t.Fatalf("seed %d: record %d unsalted", seed, i)
			}
			kept[rec.HashIDs[0]]++
			if first < 0 {
				first = i
			}
			// Jittered times, re-sorted: the first kept arrival is
			// itself moved by up to Jitter × the gap, so offsets agree
			// with the timestamps within one mean gap.
			shift := r.start - time.Duration(rec.Timestamp-recs[first].Timestamp)*time.Millisecond
			if shift < -meanGap || shift > meanGap || (k > 0 && r.start < reqs[k-1].start) {
				t.Fatalf("seed %d: record %d at %v, shifted %v (mean gap %v)", seed, i, r.start, shift, meanGap)
			}
			shifts = append(shifts, shift)
		}
		for h, n := range kept {
			if n != convSize[h] {
				t.Fatalf("seed %d: conversation %d kept %d of its %d requests", seed, h, n, convSize[h])
			}
		}
		if share := float64(len(kept)) / float64(len(convSize)); share < 0.65 || share > 0.95 {
			t.Fatalf("seed %d: kept %.2f of the conversations", seed, share)
		}
		if slices.Min(shifts) == slices.Max(shifts) {
			t.Fatalf("seed %d: no jitter", seed)
		}
		// Another seed keeps other conversations, at other times.
		var keptIDs []uint64
		for h := range kept {
			keptIDs = append(keptIDs, h)
		}
		slices.Sort(keptIDs)
		var starts []time.Duration
		for _, ps := range p.Sessions {
			starts = append(starts, ps.Start)
		}
		for _, c := range []struct {
			set map[string]uint64
			key string
		}{{keptSets, fmt.Sprint(keptIDs)}, {startSets, fmt.Sprint(starts)}} {
			if other, ok := c.set[c.key]; ok {
				t.Fatalf("seeds %d and %d: the same subsample or arrival times", other, seed)
			}
			c.set[c.key] = seed
		}
		d := planDigest(reqs)
		if other, ok := digests[d]; ok {
			t.Fatalf("seeds %d and %d: the same workload", other, seed)
		}
		digests[d] = seed
		if again, _ := sc.Plan(workload.Options{Seed: seed, Rate: 1}); planDigest(drivePlan(t, again, false)) != d {
			t.Fatalf("seed %d twice: different requests", seed)
		}
	}
	// Salting keeps the sharing: two records of one conversation share
	// their first block's run under any seed, and the run changes with it.
	a, b := workload.TraceRecord{InputLength: 600, HashIDs: []uint64{5, 6}}, workload.TraceRecord{InputLength: 700, HashIDs: []uint64{5, 7}}
	for _, seed := range []uint64{0, 1, 99} {
		x, y := workload.TraceTokens(nil, a, seed), workload.TraceTokens(nil, b, seed)
		if !slices.Equal(x[:512], y[:512]) || slices.Equal(x[512:600], y[512:600]) {
			t.Fatalf("seed %d: the shared block differs or the others match", seed)
		}
	}
	if slices.Equal(workload.TraceTokens(nil, a, 0), workload.TraceTokens(nil, a, 1)) {
		t.Fatal("seeds 0 and 1: the same token run")
	}
	// TraceTokens appends: a non-empty dst keeps its tokens and gets the
	// whole prompt.
	if got := workload.TraceTokens([]uint32{7}, a, 1); len(got) != 601 || got[0] != 7 || !slices.Equal(got[1:], workload.TraceTokens(nil, a, 1)) {
		t.Fatalf("append: %d tokens", len(got))
	}
}

// TestTraceShape: the test trace's plan at seed 1, rate 1, against the
// records.
func TestTraceShape(t *testing.T) {
	recs := readSmallTrace(t)
	var meanIn, meanOut float64
	convs := map[uint64]int{}
	for _, rec := range recs {
		meanIn += float64(rec.InputLength) / float64(len(recs))
		meanOut += float64(rec.OutputLength) / float64(len(recs))
		convs[rec.HashIDs[0]]++
	}
	singles := 0
	for _, n := range convs {
		if n == 1 {
			singles++
		}
	}
	span := time.Duration(recs[len(recs)-1].Timestamp-recs[0].Timestamp) * time.Millisecond
	rate := float64(len(recs)-1) / span.Seconds()
	var sc workload.Scenario = workload.Trace{Path: smallTrace}
	p, err := sc.Plan(workload.Options{Seed: 1, Rate: 1, MaxModelLen: sc.Fleet().MaxModelLen})
	if err != nil {
		t.Fatal(err)
	}
	s, reqs := measurePlan(t, p)
	t.Logf("trace: %v (records: %d, %d conversations, %.0f%% of the requests alone, input mean %.0f, output mean %.1f, %.2f a second); SLO %v",
		s, len(recs), len(convs), 100*float64(singles)/float64(len(recs)), meanIn, meanOut, rate, workload.Trace{}.SLO())
	if s.sessions != s.requests || !withinFrac(float64(s.requests), 0.8*float64(len(recs)), 0.15) || s.convs != s.prefixes ||
		!withinFrac(s.meanPrompt, meanIn, 0.15) || !withinFrac(s.meanOutput, meanOut, 0.15) || !withinFrac(s.rate, 0.8*rate, 0.2) ||
		!withinFrac(s.shared, 1-float64(singles)/float64(len(recs)), 0.2) || s.maxPrompt > 16*traceBlock {
		t.Fatalf("shape %v", s)
	}
	for _, r := range reqs {
		if r.body.IgnoreEOS || r.body.CacheSalt != "" || r.prompt != len(r.req.Tokens()) {
			t.Fatalf("body: ignore_eos %v, cache_salt %q, %d prompt tokens", r.body.IgnoreEOS, r.body.CacheSalt, r.prompt)
		}
	}
	f := workload.Trace{}.Fleet()
	if f.Engines != 8 || f.GPUBlocks != 65536 || f.MaxModelLen != 65535*16 {
		t.Fatalf("fleet %+v", f)
	}
}

// TestTraceErrors: the plan's own checks (file, rate, keep, the engines'
// context) and ReadTrace's validation, each error naming its line.
func TestTraceErrors(t *testing.T) {
	for name, c := range map[string]struct {
		sc workload.Trace
		o  workload.Options
	}{
		"no file":      {workload.Trace{}, workload.Options{Rate: 1}},
		"missing file": {workload.Trace{Path: "testdata/none.jsonl"}, workload.Options{Rate: 1}},
		"rate 0":       {workload.Trace{Path: smallTrace}, workload.Options{}},
		"keep 2":       {workload.Trace{Path: smallTrace, Keep: 2}, workload.Options{Rate: 1}},
		"context":      {workload.Trace{Path: smallTrace}, workload.Options{Rate: 1, MaxModelLen: 4096}},
	} {
		if _, err := c.sc.Plan(c.o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if p, err := (workload.Trace{Path: smallTrace, Limit: 10}).Plan(workload.Options{Rate: 1}); err != nil || len(p.Sessions) != 10 {
		t.Fatalf("limit 10: %v", err)
	}
	good := `{"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [1, 2]}` + "\n" +
		`{"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1, 3]}` + "\n"
	recs, err := workload.ReadTrace(strings.NewReader(good), 0)
	if err != nil || len(recs) != 2 {
		t.Fatalf("%v %+v", err, recs)
	}
	if one, _ := workload.ReadTrace(strings.NewReader(good), 1); len(one) != 1 {
		t.Fatalf("limit 1: %d records", len(one))
	}
	for name, in := range map[string]string{
		"not json":        `{"timestamp": 0,`,
		"time goes back":  good + `{"timestamp": 4, "input_length": 1, "output_length": 1, "hash_ids": [9]}`,
		"no blocks":       `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}`,
		"input too long":  `{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1]}`,
		"no output":       `{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}`,
		"negative time":   `{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}`,
		"empty":           ``,
		"too many blocks": `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [` + strings.Repeat("1,", 5000) + `1]}`,
	} {
		if _, err := workload.ReadTrace(strings.NewReader(in), 0); err == nil {
			t.Errorf("%s: accepted", name)
		} else if name != "empty" && !strings.Contains(err.Error(), "line") {
			t.Errorf("%s: %v does not name the line", name, err)
		}
	}
}

// TestTraceKeepAll: Keep 1 and no jitter make a seeded plan the trace's
// arrivals with salted prompts.
func TestTraceKeepAll(t *testing.T) {
	recs := readSmallTrace(t)
	p, err := workload.Trace{Path: smallTrace, Keep: 1, Jitter: -1}.Plan(workload.Options{Seed: 5, Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sessions) != len(recs) {
		t.Fatalf("%d sessions for %d records", len(p.Sessions), len(recs))
	}
	for i, rec := range recs {
		req, _, _ := p.Sessions[i].Session.Next(nil)
		if p.Sessions[i].Start != time.Duration(rec.Timestamp-recs[0].Timestamp)*time.Millisecond || !slices.Equal(req.Tokens(), workload.TraceTokens(nil, rec, 5)) {
			t.Fatalf("record %d: start %v", i, p.Sessions[i].Start)
		}
	}
}
