package peers

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/tier"
)

var llmdNow = time.Unix(1_700_000_000, 0)

// llmdTokens is n tokens counting up from base.
func llmdTokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// llmdReq is a request for model m at the engines' block size 16.
func llmdReq(tokens []uint32) *Request {
	return &Request{Model: "m", Tokens: tokens, BlockSize: 16, Stream: true}
}

// llmdCands is healthy candidates with the given IDs.
func llmdCands(ids ...string) []Candidate {
	out := make([]Candidate, len(ids))
	for i, id := range ids {
		out[i] = Candidate{ID: id, Healthy: true}
	}
	return out
}

func newTestLLMD(t *testing.T, edit func(*LLMDConfig)) *LLMDPolicy {
	t.Helper()
	c := DefaultLLMDConfig()
	if edit != nil {
		edit(&c)
	}
	p, err := NewLLMD(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// give makes endpoint hold the first k blocks of req in p's model.
func (p *LLMDPolicy) give(endpoint string, req *Request, k int) {
	p.cache(endpoint).addAll(p.cfg.prompt(req).hashes[:k])
}

// setLoad sets the endpoint's in-flight tokens.
func (p *LLMDPolicy) setLoad(endpoint string, tokens int) {
	p.load[endpoint] = &llmdLoad{tokens: tokens}
}

func (p *LLMDPolicy) counters(endpoint string) (tokens, requests int) {
	if l, ok := p.load[endpoint]; ok {
		return l.tokens, l.requests
	}
	return 0, 0
}

func TestLLMDConfigValidate(t *testing.T) {
	if err := DefaultLLMDConfig().Validate(); err != nil {
		t.Fatalf("default: %v", err)
	}
	if (LLMDConfig{}).Validate() == nil {
		t.Fatal("zero value accepted")
	}
	if _, err := NewLLMD(LLMDConfig{}); err == nil {
		t.Fatal("NewLLMD accepted the zero value")
	}
	bad := map[string]func(*LLMDConfig){
		"threshold > 1":    func(c *LLMDConfig) { c.AffinityThreshold = 1.1 },
		"threshold < 0":    func(c *LLMDConfig) { c.AffinityThreshold = -0.1 },
		"threshold NaN":    func(c *LLMDConfig) { c.AffinityThreshold = math.NaN() },
		"explore > 1":      func(c *LLMDConfig) { c.ExplorationProbability = 2 },
		"penalty < 0":      func(c *LLMDConfig) { c.MaxTTFTPenaltyMs = -1 },
		"penalty Inf":      func(c *LLMDConfig) { c.MaxTTFTPenaltyMs = math.Inf(1) },
		"peak 0":           func(c *LLMDConfig) { c.PeakPrefillThroughput = 0 },
		"weight 0":         func(c *LLMDConfig) { c.TokenLoadWeight = 0 },
		"cap 0":            func(c *LLMDConfig) { c.TokenLoadCap = 0 },
		"block 0":          func(c *LLMDConfig) { c.DefaultBlockSize = 0 },
		"min block 0":      func(c *LLMDConfig) { c.MinBlockSize = 0 },
		"prefix < min":     func(c *LLMDConfig) { c.MaxPrefixTokens = 63 },
		"lru capacity 0":   func(c *LLMDConfig) { c.LRUCapacity = 0 },
		"lru capacity < 0": func(c *LLMDConfig) { c.LRUCapacity = -5 },
	}
	for name, edit := range bad {
		c := DefaultLLMDConfig()
		edit(&c)
		if c.Validate() == nil {
			t.Errorf("%s accepted", name)
		}
	}
	for name, edit := range map[string]func(*LLMDConfig){
		"filter off":    func(c *LLMDConfig) { c.AffinityThreshold = 0 },
		"gate off":      func(c *LLMDConfig) { c.MaxTTFTPenaltyMs = 0 },
		"always explor": func(c *LLMDConfig) { c.ExplorationProbability = 1 },
	} {
		c := DefaultLLMDConfig()
		edit(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s refused: %v", name, err)
		}
	}
}

func TestLLMDNames(t *testing.T) {
	p := newTestLLMD(t, nil)
	q, err := NewLLMDPrecise(DefaultLLMDPreciseConfig())
	if err != nil {
		t.Fatal(err)
	}
	var _ Policy = p
	var _ Policy = q
	if p.Name() != LLMD || q.Name() != LLMDPrecise {
		t.Fatalf("names %q %q", p.Name(), q.Name())
	}
}

func TestLLMDBlocks(t *testing.T) {
	cases := []struct {
		name            string
		blockSize, L    int
		wantB, wantT    int
		wantLastPartial bool
	}{
		{"empty", 16, 0, 64, 0, false},
		{"one token is a partial block", 16, 1, 64, 1, true},
		{"exactly one block", 16, 64, 64, 1, false},
		{"one past a block", 16, 65, 64, 2, true},
		{"unknown block size: 16 raised to 64", 0, 100, 64, 2, true},
		{"engine block 128 kept", 128, 200, 128, 2, true},
		{"engine block 128, full blocks", 128, 256, 128, 2, false},
		{"at the guide's 40960-token cap", 16, 40960, 64, 640, false},
		{"past the cap", 16, 140000, 64, 640, false},
		{"past the cap, partial last block cut", 16, 40961, 64, 640, false},
		{"cap at B=256", 256, 140000, 256, 160, false},
	}
	c := DefaultLLMDConfig()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := &Request{Model: "m", Tokens: llmdTokens(tc.L, 1), BlockSize: tc.blockSize}
			pr := c.prompt(req)
			if pr.blockSize != tc.wantB || len(pr.hashes) != tc.wantT || pr.tokens != tc.L {
				t.Fatalf("B=%d T=%d L=%d, want B=%d T=%d L=%d", pr.blockSize, len(pr.hashes), pr.tokens, tc.wantB, tc.wantT, tc.L)
			}
			if !tc.wantLastPartial || tc.L == 0 {
				return
			}
			// The partial last block is hashed over its own tokens:
			// changing its last token changes its hash only.
			other := slices.Clone(req.Tokens)
			other[len(other)-1]++
			po := c.prompt(&Request{Model: "m", Tokens: other, BlockSize: tc.blockSize})
			n := len(pr.hashes)
			if po.hashes[n-1] == pr.hashes[n-1] || !slices.Equal(po.hashes[:n-1], pr.hashes[:n-1]) {
				t.Fatal("the partial last block is not hashed over its tokens")
			}
		})
	}
}

func TestLLMDHashIsolation(t *testing.T) {
	tokens := llmdTokens(300, 7)
	hash := func(model, salt string, toks []uint32) []uint64 {
		return llmdHashes(&Request{Model: model, CacheSalt: salt, Tokens: toks}, 64, 2048)
	}
	base := hash("m", "", tokens)
	if !slices.Equal(base, hash("m", "", tokens)) {
		t.Fatal("hashing is not deterministic")
	}
	differ := func(a, b []uint64) bool {
		for i := range a {
			if a[i] == b[i] {
				return false
			}
		}
		return true
	}
	for name, other := range map[string][]uint64{
		"another model":          hash("m2", "", tokens),
		"a salt":                 hash("m", "s", tokens),
		"another salt":           hash("m", "t", tokens),
		"model/salt split moved": hash("", "m", tokens),
	} {
		if !differ(base, other) {
			t.Errorf("%s shares a block hash with the base", name)
		}
	}
	if !differ(hash("ab", "c", tokens), hash("a", "bc", tokens)) {
		t.Error("model+salt is ambiguous")
	}
	if !differ(hash("m", "s", tokens), hash("m", "t", tokens)) || !differ(hash("m", "s", tokens), hash("n", "s", tokens)) {
		t.Error("salts or models of the same length share hashes")
	}
	// The chain: a change in block 1 changes blocks 1.. and not block 0.
	changed := slices.Clone(tokens)
	changed[70]++
	ch := hash("m", "", changed)
	if ch[0] != base[0] || !differ(ch[1:], base[1:]) {
		t.Error("the hashes do not chain")
	}
}

func TestLLMDWalk(t *testing.T) {
	req := llmdReq(llmdTokens(256, 1)) // 4 blocks of 64
	h := DefaultLLMDConfig().prompt(req).hashes
	cases := []struct {
		name string
		hold map[string][]int // endpoint → the blocks it holds
		want map[string]int
	}{
		{"all held somewhere: every holder counts", map[string][]int{"a": {0, 1, 2}, "b": {0, 2}, "c": {3}},
			map[string]int{"a": 3, "b": 2, "c": 1}},
		{"stops at the first block nobody holds", map[string][]int{"a": {0, 2, 3}, "b": {0}},
			map[string]int{"a": 1, "b": 1}},
		{"nobody holds block 0", map[string][]int{"a": {1, 2, 3}}, map[string]int{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestLLMD(t, nil)
			for ep, blocks := range tc.hold {
				for _, b := range blocks {
					p.cache(ep).add(h[b])
				}
			}
			got := p.matches(h)
			for ep, want := range tc.want {
				if got[ep] != want {
					t.Errorf("%s: M=%d, want %d", ep, got[ep], want)
				}
			}
			for ep, n := range got {
				if tc.want[ep] != n {
					t.Errorf("%s: M=%d, want %d", ep, n, tc.want[ep])
				}
			}
		})
	}
}

func TestLLMDHitRatio(t *testing.T) {
	first := llmdTokens(320, 1) // 5 blocks
	cases := []struct {
		name       string
		shared     int // leading tokens the second request shares
		wantHit    float64
		wantReason string
		wantIndex  int
	}{
		{"4 of 5 blocks: 0.8 is sticky", 256, 0.8, llmdReasonSticky, 0},
		{"all 5 blocks", 320, 1, llmdReasonSticky, 0},
		{"3 of 5 blocks: 0.6 is not", 192, 0.6, llmdReasonNoSticky, 1},
		{"a partial block short of 4 is 3", 250, 0.6, llmdReasonNoSticky, 1},
		{"nothing shared", 0, 0, llmdReasonNoSticky, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestLLMD(t, nil)
			cands := llmdCands("a", "b")
			p.Dispatched(llmdReq(first), "a", llmdNow) // a: 5 blocks, 320 tokens in flight
			second := append(slices.Clone(first[:tc.shared]), llmdTokens(320-tc.shared, 10_000)...)
			req := llmdReq(second)
			pr := p.cfg.prompt(req)
			if got := pr.hit(p.matches(pr.hashes)["a"]); got != tc.wantHit {
				t.Fatalf("hit %v, want %v", got, tc.wantHit)
			}
			ch := p.Pick(req, cands, 1, llmdNow)
			if ch.Reason != tc.wantReason || ch.Index != tc.wantIndex {
				t.Fatalf("picked %d (%s), want %d (%s)", ch.Index, ch.Reason, tc.wantIndex, tc.wantReason)
			}
		})
	}
	if (llmdPrompt{}).hit(0) != 0 {
		t.Error("T=0 is not a hit of 0")
	}
}

func TestLLMDLRU(t *testing.T) {
	l := newLLMDLRU(3)
	l.addAll([]uint64{1, 2}) // in order: 2 is the most recent
	l.addAll([]uint64{3, 4}) // 4, 3, 2, 1: 1 goes
	for h, want := range map[uint64]bool{1: false, 2: true, 3: true, 4: true} {
		if l.has(h) != want {
			t.Errorf("after filling: has(%d) = %v", h, !want)
		}
	}
	l.add(2) // refreshed: 2, 4, 3
	l.add(5) // 5, 2, 4: 3 goes
	for h, want := range map[uint64]bool{2: true, 3: false, 4: true, 5: true} {
		if l.has(h) != want {
			t.Errorf("after refresh: has(%d) = %v", h, !want)
		}
	}
	if l.order.Len() != 3 || len(l.at) != 3 {
		t.Errorf("size %d/%d, want 3", l.order.Len(), len(l.at))
	}
}

// TestLLMDLRUInsertOrder: a request's blocks join the LRU in upstream's
// order, block 0 first, so within one request block 0 is the least
// recent and the first evicted. Each case fills an LRU with one request
// and then adds others; the port's old order (last block first) would
// keep block 0 and evict the tail instead.
func TestLLMDLRUInsertOrder(t *testing.T) {
	cases := []struct {
		name     string
		capacity int
		requests [][]uint64 // added in turn, each in block order
		held     []uint64
		evicted  []uint64
	}{
		{"one request past capacity: its head goes", 3, [][]uint64{{1, 2, 3, 4}}, []uint64{2, 3, 4}, []uint64{1}},
		{"a second request evicts the first's head", 4, [][]uint64{{1, 2, 3}, {7, 8}}, []uint64{2, 3, 7, 8}, []uint64{1}},
		{"block 0 then block 1 go, in that order", 3, [][]uint64{{1, 2, 3}, {7}, {8}}, []uint64{3, 7, 8}, []uint64{1, 2}},
		{"a shared head re-added is refreshed, then the tail is oldest", 3, [][]uint64{{1, 2, 3}, {1}, {9}},
			[]uint64{1, 3, 9}, []uint64{2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLLMDLRU(tc.capacity)
			for _, r := range tc.requests {
				l.addAll(r)
			}
			for _, h := range tc.held {
				if !l.has(h) {
					t.Errorf("block %d was evicted, want it held", h)
				}
			}
			for _, h := range tc.evicted {
				if l.has(h) {
					t.Errorf("block %d is held, want it evicted", h)
				}
			}
		})
	}
}

func TestLLMDLRUCapacity(t *testing.T) {
	p := newTestLLMD(t, nil)
	cands := llmdCands("small", "unknown")
	cands[0].NumGPUBlocks = 3
	p.Pick(llmdReq(nil), cands, 0, llmdNow)
	first, second := llmdReq(llmdTokens(128, 1)), llmdReq(llmdTokens(128, 5000)) // 2 blocks each
	p.Dispatched(first, "small", llmdNow)
	p.Dispatched(first, "unknown", llmdNow)
	if got := p.caches["small"].capacity; got != 3 {
		t.Fatalf("capacity %d, want the reported 3", got)
	}
	if got := p.caches["unknown"].capacity; got != 31250 {
		t.Fatalf("capacity %d, want the default 31250", got)
	}
	// A later report does not resize an LRU that exists.
	cands[0].NumGPUBlocks = 100
	p.Pick(llmdReq(nil), cands, 0, llmdNow)
	p.Dispatched(second, "small", llmdNow)
	if got := p.caches["small"].capacity; got != 3 {
		t.Fatalf("capacity %d after a new report, want 3", got)
	}
	// small held first's 2 blocks, block 0 the least recent; second's 2
	// evict first's block 0.
	h := p.cfg.prompt(first).hashes
	if p.caches["small"].has(h[0]) || !p.caches["small"].has(h[1]) {
		t.Fatal("eviction at capacity did not drop the least recent block, the request's block 0")
	}
	p.Forget("unknown")
	if m := p.matches(h)["small"]; m != 0 {
		t.Fatalf("small matches %d blocks without its block 0, want 0", m)
	}
}

func TestLLMDUncached(t *testing.T) {
	cases := []struct{ T, M, B, L, want int }{
		{5, 0, 64, 320, 320},
		{5, 4, 64, 320, 64},
		{5, 5, 64, 320, 0},
		{5, 4, 64, 300, 64},             // the partial last block counts in full
		{5, 5, 64, 300, 0},              // L < T·B: no tail
		{2048, 0, 64, 140000, 140000},   // the tokens past the hashed blocks
		{2048, 2048, 64, 140000, 8928},  // only those
		{0, 0, 64, 0, 0},                // no tokens
		{2, 3, 64, 128, 0},              // M > T never negative
		{2048, 1000, 64, 131072, 67072}, // (2048−1000)·64
	}
	for _, tc := range cases {
		pr := llmdPrompt{hashes: make([]uint64, tc.T), blockSize: tc.B, tokens: tc.L}
		if got := pr.uncached(tc.M); got != tc.want {
			t.Errorf("T=%d M=%d B=%d L=%d: %d, want %d", tc.T, tc.M, tc.B, tc.L, got, tc.want)
		}
	}
}

func TestLLMDFilter(t *testing.T) {
	req := llmdReq(llmdTokens(320, 1)) // 5 blocks
	type ep struct {
		blocks, load int
		healthy      bool
	}
	cases := []struct {
		name       string
		edit       func(*LLMDConfig)
		eps        map[string]ep
		wantReason string
		want       string
	}{
		{"sticky wins though busier", nil,
			map[string]ep{"a": {4, 100_000, true}, "b": {0, 0, true}}, llmdReasonSticky, "a"},
		{"the least loaded sticky one", nil,
			map[string]ep{"a": {5, 50_000, true}, "a2": {4, 10_000, true}, "b": {0, 0, true}}, llmdReasonSticky, "a2"},
		{"below the threshold: all, by load", nil,
			map[string]ep{"a": {3, 100_000, true}, "b": {0, 0, true}}, llmdReasonNoSticky, "b"},
		{"a lower threshold makes it sticky", func(c *LLMDConfig) { c.AffinityThreshold = 0.6 },
			map[string]ep{"a": {3, 100_000, true}, "b": {0, 0, true}}, llmdReasonSticky, "a"},
		{"gate at τ exactly: holds", nil,
			map[string]ep{"a": {5, 286_704, true}, "b": {0, 0, true}}, llmdReasonSticky, "a"},
		{"gate one token past τ: breaks", nil,
			map[string]ep{"a": {5, 286_705, true}, "b": {0, 0, true}}, llmdReasonGateBroken, "b"},
		{"gate compares the gap, not the level: holds", nil,
			map[string]ep{"a": {5, 1000 + 286_000, true}, "b": {0, 1000, true}}, llmdReasonSticky, "a"},
		{"gate compares the gap, not the level: breaks", nil,
			map[string]ep{"a": {5, 1000 + 286_705, true}, "b": {0, 1000, true}}, llmdReasonGateBroken, "b"},
		{"gate uses the least loaded sticky one", nil,
			map[string]ep{"a": {5, 900_000, true}, "a2": {5, 1000, true}, "b": {0, 0, true}}, llmdReasonSticky, "a2"},
		{"maxTTFTPenaltyMs 0 never breaks", func(c *LLMDConfig) { c.MaxTTFTPenaltyMs = 0 },
			map[string]ep{"a": {5, 4_000_000, true}, "b": {0, 0, true}}, llmdReasonSticky, "a"},
		{"all sticky: no gate", nil,
			map[string]ep{"a": {5, 900_000, true}, "a2": {5, 0, true}}, llmdReasonSticky, "a2"},
		{"threshold 0: filter off", func(c *LLMDConfig) { c.AffinityThreshold = 0 },
			map[string]ep{"a": {5, 100_000, true}, "b": {0, 0, true}}, llmdReasonNoSticky, "b"},
		{"one healthy candidate", nil,
			map[string]ep{"a": {5, 0, false}, "b": {0, 0, true}}, llmdReasonSingle, "b"},
		{"an unhealthy sticky one is not considered", nil,
			map[string]ep{"a": {5, 0, false}, "b": {0, 5000, true}, "c": {0, 0, true}}, llmdReasonNoSticky, "c"},
		{"exploration 1: all", func(c *LLMDConfig) { c.ExplorationProbability = 1 },
			map[string]ep{"a": {5, 100_000, true}, "b": {0, 0, true}}, llmdReasonExplore, "b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestLLMD(t, tc.edit)
			var cands []Candidate
			for _, id := range []string{"a", "a2", "b", "c"} {
				e, ok := tc.eps[id]
				if !ok {
					continue
				}
				p.give(id, req, e.blocks)
				p.setLoad(id, e.load)
				cands = append(cands, Candidate{ID: id, Healthy: e.healthy})
			}
			for rnd := range uint64(20) {
				ch := p.Pick(req, cands, rnd, llmdNow)
				if ch.Reason != tc.wantReason || ch.Index < 0 || cands[ch.Index].ID != tc.want {
					t.Fatalf("rnd %d: picked %d (%s), want %s (%s); scores %v", rnd, ch.Index, ch.Reason, tc.want, tc.wantReason, ch.Scores)
				}
			}
		})
	}
}

func TestLLMDFilteredOutScoreZero(t *testing.T) {
	p := newTestLLMD(t, nil)
	req := llmdReq(llmdTokens(320, 1))
	p.give("a", req, 5)
	ch := p.Pick(req, llmdCands("a", "b"), 0, llmdNow)
	if ch.Reason != llmdReasonSticky || ch.Index != 0 {
		t.Fatalf("%+v", ch)
	}
	if ch.Scores[1] != 0 || ch.Scores[0] != 1 {
		t.Fatalf("scores %v, want [1 0]: the sticky one fully cached, the other filtered out", ch.Scores)
	}
}

func TestLLMDExplorationProbability(t *testing.T) {
	p := newTestLLMD(t, func(c *LLMDConfig) { c.ExplorationProbability = 0.5 })
	req := llmdReq(llmdTokens(320, 1))
	p.give("a", req, 5)
	cands := llmdCands("a", "b")
	counts := map[string]int{}
	for rnd := range uint64(1000) {
		counts[p.Pick(req, cands, rnd, llmdNow).Reason]++
	}
	if counts[llmdReasonExplore] < 400 || counts[llmdReasonSticky] < 400 {
		t.Fatalf("reasons %v, want about half each", counts)
	}
}

func TestLLMDTokenLoadScore(t *testing.T) {
	cases := []struct {
		name     string
		inflight int
		L        int
		want     float64
	}{
		{"idle, 2 blocks uncached", 0, 100, 1 - 128.0/4194304},
		{"in flight plus uncached", 1_000_000, 100, 1 - 1_000_128.0/4194304},
		{"exactly the cap", 4194304 - 128, 100, 0},
		{"past the cap", 5_000_000, 100, 0},
		{"nothing at all", 0, 0, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestLLMD(t, nil)
			p.setLoad("a", tc.inflight)
			ch := p.Pick(llmdReq(llmdTokens(tc.L, 1)), llmdCands("a", "b"), 0, llmdNow)
			if math.Abs(ch.Scores[0]-tc.want) > 1e-12 {
				t.Fatalf("score %v, want %v", ch.Scores[0], tc.want)
			}
		})
	}
	p := newTestLLMD(t, func(c *LLMDConfig) { c.TokenLoadWeight = 2 })
	if ch := p.Pick(llmdReq(nil), llmdCands("a"), 0, llmdNow); ch.Scores[0] != 2 {
		t.Fatalf("weight 2: score %v", ch.Scores[0])
	}
}

func TestLLMDTokenLoadArgmin(t *testing.T) {
	p := newTestLLMD(t, nil)
	p.setLoad("a", 1000)
	p.setLoad("b", 999)
	p.setLoad("c", 5000)
	for rnd := range uint64(50) {
		if ch := p.Pick(llmdReq(llmdTokens(64, 1)), llmdCands("a", "b", "c"), rnd, llmdNow); ch.Index != 1 {
			t.Fatalf("picked %d, want the least loaded", ch.Index)
		}
	}
	// Past the cap, all score 0: a random tie.
	for _, id := range []string{"a", "b", "c"} {
		p.setLoad(id, 5_000_000)
	}
	seen := map[int]bool{}
	for rnd := range uint64(200) {
		seen[p.Pick(llmdReq(llmdTokens(64, 1)), llmdCands("a", "b", "c"), rnd, llmdNow).Index] = true
	}
	if len(seen) != 3 {
		t.Fatalf("over the cap the picks went to %v, want all three", seen)
	}
}

func TestLLMDRelease(t *testing.T) {
	type step struct {
		op                   string // "chunk", "token" or "done"
		wantTokens, wantReqs int
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"streaming: tokens at FirstChunk, request at Done",
			[]step{{"chunk", 0, 1}, {"done", 0, 0}}},
		{"non-streaming: both at Done", []step{{"done", 0, 0}}},
		{"FirstToken releases nothing", []step{{"token", 320, 1}, {"chunk", 0, 1}, {"token", 0, 1}, {"done", 0, 0}}},
		{"FirstChunk twice releases once", []step{{"chunk", 0, 1}, {"chunk", 0, 1}, {"done", 0, 0}}},
		{"after Done nothing more", []step{{"done", 0, 0}, {"done", 0, 0}, {"chunk", 0, 0}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestLLMD(t, nil)
			p.Dispatched(llmdReq(llmdTokens(100, 9)), "a", llmdNow) // another request, still in flight
			tk := p.Dispatched(llmdReq(llmdTokens(320, 1)), "a", llmdNow)
			if tok, n := p.counters("a"); tok != 128+320 || n != 2 {
				t.Fatalf("booked %d tokens, %d requests; want 448, 2", tok, n)
			}
			for _, s := range tc.steps {
				switch s.op {
				case "chunk":
					p.FirstChunk(tk, llmdNow)
				case "token":
					p.FirstToken(tk, llmdNow)
				default:
					p.Done(tk, llmdNow)
				}
				if tok, n := p.counters("a"); tok != 128+s.wantTokens || n != 1+s.wantReqs {
					t.Fatalf("after %s: %d tokens, %d requests; want %d, %d", s.op, tok, n, 128+s.wantTokens, 1+s.wantReqs)
				}
			}
		})
	}
}

func TestLLMDBooksUncachedOnly(t *testing.T) {
	p := newTestLLMD(t, nil)
	req := llmdReq(llmdTokens(320, 1))
	p.Dispatched(req, "a", llmdNow) // cold: 320
	p.Dispatched(req, "a", llmdNow) // warm: 0
	if tok, n := p.counters("a"); tok != 320 || n != 2 {
		t.Fatalf("%d tokens %d requests, want 320, 2", tok, n)
	}
	// The in-flight tokens steer the next cold request away.
	if ch := p.Pick(llmdReq(llmdTokens(64, 90_000)), llmdCands("a", "b"), 0, llmdNow); ch.Index != 1 {
		t.Fatalf("picked %d, want the idle endpoint", ch.Index)
	}
}

func TestLLMDForget(t *testing.T) {
	p := newTestLLMD(t, nil)
	req := llmdReq(llmdTokens(320, 1))
	tk := p.Dispatched(req, "a", llmdNow)
	keep := p.Dispatched(req, "b", llmdNow)
	p.Forget("a")
	if _, ok := p.caches["a"]; ok {
		t.Fatal("the LRU survived Forget")
	}
	if tok, n := p.counters("a"); tok != 0 || n != 0 {
		t.Fatal("the counters survived Forget")
	}
	p.FirstChunk(tk, llmdNow)
	p.Done(tk, llmdNow)
	if tok, n := p.counters("a"); tok != 0 || n != 0 {
		t.Fatalf("a forgotten booking changed the counters: %d %d", tok, n)
	}
	if m := p.matches(p.cfg.prompt(req).hashes); m["a"] != 0 || m["b"] != 5 {
		t.Fatalf("matches after Forget %v", m)
	}
	p.Done(keep, llmdNow)
	if tok, n := p.counters("b"); tok != 0 || n != 0 {
		t.Fatalf("b's booking: %d %d", tok, n)
	}
}

func TestLLMDTieBreak(t *testing.T) {
	p := newTestLLMD(t, nil)
	cands := llmdCands("a", "b", "c", "d")
	req := llmdReq(llmdTokens(200, 1))
	counts := make([]int, len(cands))
	for rnd := range uint64(4000) {
		ch := p.Pick(req, cands, rnd, llmdNow)
		if again := p.Pick(req, cands, rnd, llmdNow); again.Index != ch.Index {
			t.Fatalf("rnd %d: %d then %d", rnd, ch.Index, again.Index)
		}
		counts[ch.Index]++
	}
	for i, n := range counts {
		if n < 850 || n > 1150 {
			t.Errorf("candidate %d chosen %d of 4000 times, want about 1000", i, n)
		}
	}
}

func TestLLMDHealth(t *testing.T) {
	p := newTestLLMD(t, nil)
	req := llmdReq(llmdTokens(320, 1))
	p.give("a", req, 5)
	cands := llmdCands("a", "b", "c")
	cands[0].Healthy, cands[2].Healthy = false, false
	for rnd := range uint64(100) {
		if ch := p.Pick(req, cands, rnd, llmdNow); ch.Index != 1 || ch.Scores[0] != 0 || ch.Scores[2] != 0 {
			t.Fatalf("%+v", ch)
		}
	}
	cands[1].Healthy = false
	ch := p.Pick(req, cands, 0, llmdNow)
	if ch.Index != -1 || ch.Reason != llmdReasonNoneHealthy || len(ch.Scores) != 3 || slices.ContainsFunc(ch.Scores, func(s float64) bool { return s != 0 }) {
		t.Fatalf("none healthy: %+v", ch)
	}
	if ch := p.Pick(req, nil, 0, llmdNow); ch.Index != -1 {
		t.Fatalf("no candidates: %+v", ch)
	}
}

// Precise.

func newTestPrecise(t *testing.T, edit func(*LLMDPreciseConfig)) *LLMDPrecisePolicy {
	t.Helper()
	c := DefaultLLMDPreciseConfig()
	if edit != nil {
		edit(&c)
	}
	p, err := NewLLMDPrecise(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func llmdMatched(gpu, cpu, storage int) [tier.Count]int {
	var m [tier.Count]int
	m[tier.GPU], m[tier.CPU], m[tier.Storage] = gpu, cpu, storage
	return m
}

func TestLLMDPreciseConfigValidate(t *testing.T) {
	if err := DefaultLLMDPreciseConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if (LLMDPreciseConfig{}).Validate() == nil {
		t.Fatal("zero value accepted")
	}
	if _, err := NewLLMDPrecise(LLMDPreciseConfig{}); err == nil {
		t.Fatal("NewLLMDPrecise accepted the zero value")
	}
	for name, edit := range map[string]func(*LLMDPreciseConfig){
		"all weights 0":   func(c *LLMDPreciseConfig) { c.PrefixWeight, c.KVUtilizationWeight, c.QueueWeight = 0, 0, 0 },
		"negative weight": func(c *LLMDPreciseConfig) { c.QueueWeight = -1 },
		"NaN weight":      func(c *LLMDPreciseConfig) { c.PrefixWeight = math.NaN() },
		"gpu weight 0":    func(c *LLMDPreciseConfig) { c.GPUWeight = 0 },
		"cpu weight < 0":  func(c *LLMDPreciseConfig) { c.CPUWeight = -0.1 },
		"block size 0":    func(c *LLMDPreciseConfig) { c.DefaultBlockSize = 0 },
	} {
		c := DefaultLLMDPreciseConfig()
		edit(&c)
		if c.Validate() == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func TestLLMDPreciseWeights(t *testing.T) {
	p := newTestPrecise(t, nil)
	req := llmdReq(llmdTokens(64, 1)) // T = 4 at B = 16
	cands := []Candidate{
		{ID: "a", Healthy: true, Matched: llmdMatched(4, 0, 0), KVUsage: 0.5, Waiting: 10},
		{ID: "b", Healthy: true, KVUsage: 0, Waiting: 0},
	}
	ch := p.Pick(req, cands, 0, llmdNow)
	// a: 2·1 + 1·0.5 + 1·0 = 2.5; b: 2·0 + 1·1 + 1·1 = 2.
	if ch.Index != 0 || ch.Reason != llmdReasonPrefix || ch.Scores[0] != 2.5 || ch.Scores[1] != 2 {
		t.Fatalf("%+v", ch)
	}
	// Half the prefix: a 2·0.5 + 0.5 = 1.5 loses to b's 2.
	cands[0].Matched = llmdMatched(2, 0, 0)
	if ch := p.Pick(req, cands, 0, llmdNow); ch.Index != 1 || ch.Reason != llmdReasonLoad || ch.Scores[0] != 1.5 {
		t.Fatalf("%+v", ch)
	}
	// Other weights.
	q := newTestPrecise(t, func(c *LLMDPreciseConfig) { c.PrefixWeight, c.KVUtilizationWeight, c.QueueWeight = 3, 2, 2 })
	cands[0].Matched = llmdMatched(4, 0, 0)
	if ch := q.Pick(req, cands, 0, llmdNow); ch.Scores[0] != 4 || ch.Scores[1] != 4 {
		t.Fatalf("3/2/2: %v, want [4 4]", ch.Scores)
	}
}

func TestLLMDPreciseQueue(t *testing.T) {
	cases := []struct {
		name    string
		waiting []float64
		healthy []bool
		want    []float64 // queue scores (prefix 0, KV usage 0: total = 1 + q)
	}{
		{"min-max", []float64{0, 5, 10}, []bool{true, true, true}, []float64{1, 0.5, 0}},
		{"all equal: 1 for all", []float64{3, 3, 3}, []bool{true, true, true}, []float64{1, 1, 1}},
		{"all zero", []float64{0, 0}, []bool{true, true}, []float64{1, 1}},
		{"over the healthy only", []float64{2, 100, 4}, []bool{true, false, true}, []float64{1, -1, 0}},
		{"one healthy", []float64{7}, []bool{true}, []float64{1}},
	}
	p := newTestPrecise(t, nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cands := make([]Candidate, len(tc.waiting))
			for i := range cands {
				cands[i] = Candidate{ID: string(rune('a' + i)), Healthy: tc.healthy[i], Waiting: tc.waiting[i]}
			}
			ch := p.Pick(llmdReq(llmdTokens(64, 1)), cands, 0, llmdNow)
			for i, q := range tc.want {
				want := 1 + q
				if !tc.healthy[i] {
					want = 0
				}
				if math.Abs(ch.Scores[i]-want) > 1e-12 {
					t.Errorf("candidate %d: %v, want %v", i, ch.Scores[i], want)
				}
			}
		})
	}
}

func TestLLMDPreciseKVUtilization(t *testing.T) {
	p := newTestPrecise(t, nil)
	for _, tc := range []struct{ usage, want float64 }{
		{0, 1}, {0.25, 0.75}, {1, 0}, {1.5, 0}, {-0.5, 1}, {math.NaN(), 0},
	} {
		cands := []Candidate{{ID: "a", Healthy: true, KVUsage: tc.usage}}
		// One candidate: queue 1, prefix 0.
		if ch := p.Pick(llmdReq(llmdTokens(64, 1)), cands, 0, llmdNow); math.Abs(ch.Scores[0]-(1+tc.want)) > 1e-12 {
			t.Errorf("usage %v: total %v, want %v", tc.usage, ch.Scores[0], 1+tc.want)
		}
	}
}

func TestLLMDPrecisePrefix(t *testing.T) {
	cases := []struct {
		name              string
		gpu, cpu, storage int
		L                 int // tokens at B = 16
		want              float64
	}{
		{"all on GPU", 10, 0, 0, 160, 1},
		{"CPU run: 5·0.8 = 4", 0, 5, 0, 160, 0.4},
		{"GPU then CPU: 3 + 2·0.8 = 4.6 → 4", 3, 5, 0, 160, 0.4},
		{"CPU run inside the GPU run", 5, 2, 0, 160, 0.5},
		{"one CPU block truncates to 0", 0, 1, 0, 160, 0},
		{"two CPU blocks: 1.6 → 1", 0, 2, 0, 160, 0.1},
		{"ten CPU blocks summed one by one: 7.999… → 7", 0, 10, 0, 160, 0.7},
		{"storage ignored", 0, 0, 10, 160, 0},
		{"storage past GPU ignored", 2, 0, 10, 160, 0.2},
		{"T counts full blocks: 10 of floor(170/16)=10", 10, 0, 0, 170, 1},
		{"T counts full blocks: 5 of 10", 5, 0, 0, 175, 0.5},
		{"no full block: 0", 0, 0, 0, 15, 0},
	}
	p := newTestPrecise(t, nil)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := p.prefix(llmdMatched(tc.gpu, tc.cpu, tc.storage), p.totalBlocks(llmdReq(llmdTokens(tc.L, 1))))
			if math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("prefix %v, want %v", got, tc.want)
			}
		})
	}
	// The engines' block size decides T; 16 when unknown; with no
	// tokens, the keys count.
	for _, tc := range []struct {
		blockSize, L, keys, want int
	}{{16, 100, 0, 6}, {64, 100, 0, 1}, {0, 100, 0, 6}, {16, 0, 3, 3}} {
		req := &Request{Tokens: llmdTokens(tc.L, 1), BlockSize: tc.blockSize, Keys: make([]blockkey.Key, tc.keys)}
		if got := p.totalBlocks(req); got != tc.want {
			t.Errorf("B=%d L=%d keys=%d: T=%d, want %d", tc.blockSize, tc.L, tc.keys, got, tc.want)
		}
	}
}

func TestLLMDPreciseTiesAndHealth(t *testing.T) {
	p := newTestPrecise(t, nil)
	cands := llmdCands("a", "b", "c")
	req := llmdReq(llmdTokens(64, 1))
	counts := make([]int, 3)
	for rnd := range uint64(3000) {
		ch := p.Pick(req, cands, rnd, llmdNow)
		if p.Pick(req, cands, rnd, llmdNow).Index != ch.Index {
			t.Fatal("not reproducible")
		}
		counts[ch.Index]++
	}
	for i, n := range counts {
		if n < 850 || n > 1150 {
			t.Errorf("candidate %d: %d of 3000", i, n)
		}
	}
	cands[0].Matched = llmdMatched(4, 0, 0)
	cands[0].Healthy = false
	if ch := p.Pick(req, cands, 0, llmdNow); ch.Index == 0 || ch.Scores[0] != 0 {
		t.Fatalf("chose the unhealthy one: %+v", ch)
	}
	for i := range cands {
		cands[i].Healthy = false
	}
	if ch := p.Pick(req, cands, 0, llmdNow); ch.Index != -1 || ch.Reason != llmdReasonNoneHealthy {
		t.Fatalf("%+v", ch)
	}
	// No bookings.
	tk := p.Dispatched(req, "a", llmdNow)
	p.FirstChunk(tk, llmdNow)
	p.FirstToken(tk, llmdNow)
	p.Done(tk, llmdNow)
	p.Forget("a")
	if p.Dispatched(req, "a", llmdNow) == tk {
		t.Fatal("tickets repeat")
	}
}

// FuzzLLMDPick drives both policies with arbitrary fleets and lifecycles:
// Pick never panics, and chooses a healthy candidate, or -1 exactly when
// none is healthy.
func FuzzLLMDPick(f *testing.F) {
	f.Add([]byte{3, 0xff, 10, 20, 30, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0})
	f.Add([]byte{5, 0x00, 1, 1, 1})
	f.Add([]byte{8, 0x5a, 200, 0, 255, 17, 3, 99, 250, 1, 0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		pol := []Policy{newTestLLMD(t, func(c *LLMDConfig) { c.ExplorationProbability = 0.1 }), newTestPrecise(t, nil)}
		n, health, rest := int(data[0]%9), data[1], data[2:]
		at := func(i int) byte {
			if len(rest) == 0 {
				return 0
			}
			return rest[i%len(rest)]
		}
		cands := make([]Candidate, n)
		for i := range cands {
			b := at(i)
			cands[i] = Candidate{
				ID: string(rune('a' + i%4)), Healthy: health>>i&1 == 1, // IDs may repeat
				Matched:      llmdMatched(int(b%7), int(b/7%9), int(b%3)),
				Waiting:      float64(b % 5),
				KVUsage:      float64(b) / 200,
				NumGPUBlocks: int(b % 4),
			}
		}
		tickets := make([][]Ticket, len(pol))
		for step := range 12 {
			b := at(step + n)
			tokens := make([]uint32, int(b)*3)
			for j := range tokens {
				tokens[j] = uint32(at(j) % 4)
			}
			req := &Request{Model: "m", Tokens: tokens, BlockSize: int(b % 3 * 16), Stream: b%2 == 0}
			for k, p := range pol {
				ch := p.Pick(req, cands, uint64(step)*uint64(b+1), llmdNow)
				anyHealthy := slices.ContainsFunc(cands, func(c Candidate) bool { return c.Healthy })
				if len(ch.Scores) != n || (ch.Index == -1) == anyHealthy || (ch.Index >= 0 && !cands[ch.Index].Healthy) {
					t.Fatalf("%s: %+v for %+v", p.Name(), ch, cands)
				}
				if ch.Index < 0 {
					continue
				}
				tickets[k] = append(tickets[k], p.Dispatched(req, cands[ch.Index].ID, llmdNow))
				switch mid := tickets[k][len(tickets[k])/2]; b % 4 {
				case 0:
					p.FirstChunk(mid, llmdNow)
					p.FirstToken(mid, llmdNow)
				case 1:
					p.Done(mid, llmdNow)
				case 2:
					p.Forget(cands[ch.Index].ID)
				}
			}
		}
		if l, ok := pol[0].(*LLMDPolicy); ok {
			for id, c := range l.load {
				if c.tokens < 0 || c.requests < 0 {
					t.Fatalf("%s: negative counters %+v", id, *c)
				}
			}
		}
	})
}

func TestLLMDConfigErrorsNamePolicy(t *testing.T) {
	err := LLMDConfig{}.Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "llm-d config: ") || !strings.Contains(err.Error(), "PeakPrefillThroughput") {
		t.Fatalf("%v", err)
	}
	err = LLMDPreciseConfig{}.Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "llm-d-precise config: ") || !strings.Contains(err.Error(), "DefaultBlockSize") {
		t.Fatalf("%v", err)
	}
}
