package peers_test

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/peers"
)

var dynT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// dynReq is a request of n prompt tokens with the given block keys, at
// block size 16.
func dynReq(n int, keys ...uint64) *peers.Request {
	r := &peers.Request{Model: "m", BlockSize: 16, Tokens: make([]uint32, n)}
	for _, k := range keys {
		r.Keys = append(r.Keys, blockkey.Key(k))
	}
	return r
}

// dynCand is a healthy candidate holding gpu, cpu and disk leading blocks.
func dynCand(id string, gpu, cpu, disk int) peers.Candidate {
	return peers.Candidate{ID: id, Healthy: true, Matched: [tier.Count]int{gpu, cpu, disk}}
}

func dynNew(t *testing.T, c peers.DynamoConfig) *peers.DynamoPolicy {
	t.Helper()
	p, err := peers.NewDynamo(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// dynBook picks for req among one candidate (id, with dev device blocks)
// and dispatches it there.
func dynBook(p *peers.DynamoPolicy, req *peers.Request, id string, dev int, now time.Time) peers.Ticket {
	p.Pick(req, []peers.Candidate{dynCand(id, dev, 0, 0)}, 0, now)
	return p.Dispatched(req, id, now)
}

// dynLoad is id's cost for an empty request: A_w/16 + D_w (+ κ·R_w).
func dynLoad(p *peers.DynamoPolicy, id string, now time.Time) float64 {
	return p.Pick(dynReq(0), []peers.Candidate{dynCand(id, 0, 0, 0)}, 0, now).Scores[0]
}

func dynNear(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestDynamoConfig(t *testing.T) {
	d := peers.DefaultDynamoConfig()
	want := peers.DynamoConfig{OverlapCredit: 1, PrefillLoadScale: 1, HostCredit: 0.75, DiskCredit: 0.25, StaleAfter: 3600 * time.Second}
	if d != want {
		t.Fatalf("defaults %+v, want %+v", d, want)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	for name, mod := range map[string]func(*peers.DynamoConfig){
		"zero value":       func(c *peers.DynamoConfig) { *c = peers.DynamoConfig{} },
		"no stale age":     func(c *peers.DynamoConfig) { c.StaleAfter = 0 },
		"negative credit":  func(c *peers.DynamoConfig) { c.OverlapCredit = -1 },
		"NaN scale":        func(c *peers.DynamoConfig) { c.PrefillLoadScale = math.NaN() },
		"infinite host":    func(c *peers.DynamoConfig) { c.HostCredit = math.Inf(1) },
		"negative disk":    func(c *peers.DynamoConfig) { c.DiskCredit = -0.1 },
		"negative kappa":   func(c *peers.DynamoConfig) { c.ActiveRequestWeight = -1 },
		"negative temp":    func(c *peers.DynamoConfig) { c.Temperature = -1 },
		"negative decay":   func(c *peers.DynamoConfig) { c.OverlapCreditDecay = -1 },
		"negative max age": func(c *peers.DynamoConfig) { c.StaleAfter = -time.Second },
	} {
		c := peers.DefaultDynamoConfig()
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("%s: valid", name)
		}
		if _, err := peers.NewDynamo(c); err == nil {
			t.Errorf("%s: NewDynamo accepted it", name)
		}
	}
	p := dynNew(t, d)
	var _ peers.Policy = p
	if p.Name() != peers.Dynamo || p.Name() != "dynamo" {
		t.Errorf("name %q", p.Name())
	}
}

// dynPrior is a request booked before the one under test.
type dynPrior struct {
	on         string
	tokens     int
	keys       []uint64
	dev        int // device overlap its Pick saw
	firstToken bool
}

func TestDynamoCost(t *testing.T) {
	base := peers.DefaultDynamoConfig()
	with := func(mod func(*peers.DynamoConfig)) peers.DynamoConfig {
		c := base
		mod(&c)
		return c
	}
	// The request under test: 64 tokens, 4 blocks (keys 1..4), B = 16,
	// so raw = (A_w + 64)/16 and N_w = 4 on a worker with no blocks.
	for _, tc := range []struct {
		name  string
		cfg   peers.DynamoConfig
		prior []dynPrior
		cands []peers.Candidate
		want  []float64
	}{
		{name: "cold, idle: L/B + N", cands: []peers.Candidate{dynCand("a", 0, 0, 0)}, want: []float64{4 + 4}},
		{name: "device overlap credits c per block", cands: []peers.Candidate{dynCand("a", 2, 0, 0)}, want: []float64{2 + 4}},
		{name: "host beyond device credits 0.75", cands: []peers.Candidate{dynCand("a", 2, 3, 0)}, want: []float64{(4 - 2 - 0.75) + 4}},
		{name: "host within device is not credited twice", cands: []peers.Candidate{dynCand("a", 3, 1, 0)}, want: []float64{1 + 4}},
		{name: "disk alone credits 0.25", cands: []peers.Candidate{dynCand("a", 0, 0, 4)}, want: []float64{(4 - 1) + 4}},
		{name: "disk beyond host beyond device", cands: []peers.Candidate{dynCand("a", 1, 3, 4)}, want: []float64{(4 - 1 - 1.5 - 0.25) + 4}},
		{name: "full device overlap: no prefill", cands: []peers.Candidate{dynCand("a", 4, 4, 4)}, want: []float64{0 + 4}},
		{
			name:  "credit beyond raw is floored at 0",
			cfg:   with(func(c *peers.DynamoConfig) { c.OverlapCredit = 2 }),
			cands: []peers.Candidate{dynCand("a", 3, 0, 0)}, want: []float64{0 + 4},
		},
		{
			name:  "rho scales prefill only",
			cfg:   with(func(c *peers.DynamoConfig) { c.PrefillLoadScale = 2 }),
			cands: []peers.Candidate{dynCand("a", 1, 0, 0)}, want: []float64{2*3 + 4},
		},
		{
			name:  "rho 0, c 0: load only",
			cfg:   with(func(c *peers.DynamoConfig) { c.PrefillLoadScale, c.OverlapCredit = 0, 0 }),
			prior: []dynPrior{{on: "a", tokens: 32, keys: []uint64{10, 11}}},
			cands: []peers.Candidate{dynCand("a", 4, 0, 0), dynCand("b", 0, 0, 0)}, want: []float64{2 + 4, 0 + 4},
		},
		{
			name:  "booked prefill adds to raw",
			prior: []dynPrior{{on: "a", tokens: 32, keys: []uint64{10, 11}}},
			cands: []peers.Candidate{dynCand("a", 0, 0, 0), dynCand("b", 0, 0, 0)},
			want:  []float64{(32+64)/16.0 + 2 + 4, 4 + 4},
		},
		{
			name:  "booked prefill is L minus the device overlap its Pick saw",
			prior: []dynPrior{{on: "a", tokens: 64, keys: []uint64{10, 11, 12, 13}, dev: 3}},
			cands: []peers.Candidate{dynCand("a", 0, 0, 0)},
			want:  []float64{(16+64)/16.0 + 4 + 4},
		},
		{
			name:  "prefill released at first token, blocks stay",
			prior: []dynPrior{{on: "a", tokens: 32, keys: []uint64{10, 11}, firstToken: true}},
			cands: []peers.Candidate{dynCand("a", 0, 0, 0)},
			want:  []float64{4 + 2 + 4},
		},
		{
			name: "D dedups blocks across requests",
			prior: []dynPrior{
				{on: "a", tokens: 48, keys: []uint64{10, 11, 12}, firstToken: true},
				{on: "a", tokens: 48, keys: []uint64{10, 11, 13}, firstToken: true},
			},
			cands: []peers.Candidate{dynCand("a", 0, 0, 0)},
			want:  []float64{4 + 4 + 4},
		},
		{
			name:  "N counts only the request's blocks not active",
			prior: []dynPrior{{on: "a", tokens: 48, keys: []uint64{1, 2, 9}, firstToken: true}},
			cands: []peers.Candidate{dynCand("a", 0, 0, 0), dynCand("b", 0, 0, 0)},
			want:  []float64{4 + 3 + 2, 4 + 4},
		},
		{
			name: "kappa weighs active requests",
			cfg:  with(func(c *peers.DynamoConfig) { c.ActiveRequestWeight = 0.5 }),
			prior: []dynPrior{
				{on: "a", tokens: 16, keys: []uint64{10}, firstToken: true},
				{on: "a", tokens: 16, keys: []uint64{10}, firstToken: true},
			},
			cands: []peers.Candidate{dynCand("a", 0, 0, 0)},
			want:  []float64{4 + 1 + 4 + 0.5*2},
		},
		{
			name:  "decay shrinks the device credit on the busier worker",
			cfg:   with(func(c *peers.DynamoConfig) { c.OverlapCreditDecay = 1 }),
			prior: []dynPrior{{on: "a", tokens: 32, keys: []uint64{10, 11}}},
			// a: A = 32, min A = 0, excess (32/16)/4 = 0.5, c_eff = 1/1.5.
			cands: []peers.Candidate{dynCand("a", 3, 0, 0), dynCand("b", 3, 0, 0)},
			want:  []float64{(6 - 3/1.5) + 2 + 4, (4 - 3) + 4},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg == (peers.DynamoConfig{}) {
				cfg = base
			}
			p := dynNew(t, cfg)
			for _, pr := range tc.prior {
				tk := dynBook(p, dynReq(pr.tokens, pr.keys...), pr.on, pr.dev, dynT0)
				if pr.firstToken {
					p.FirstToken(tk, dynT0)
				}
			}
			ch := p.Pick(dynReq(64, 1, 2, 3, 4), tc.cands, 0, dynT0)
			for i, w := range tc.want {
				if !dynNear(ch.Scores[i], w) {
					t.Errorf("cost[%d] = %v, want %v", i, ch.Scores[i], w)
				}
			}
		})
	}
}

func TestDynamoBlocksReleasedAtDoneOnly(t *testing.T) {
	p := dynNew(t, peers.DefaultDynamoConfig())
	t1 := dynBook(p, dynReq(48, 1, 2, 3), "a", 0, dynT0)
	t2 := dynBook(p, dynReq(48, 1, 2, 4), "a", 0, dynT0)
	steps := []struct {
		name string
		do   func()
		want float64 // A/16 + D
	}{
		{"booked", func() {}, 96/16.0 + 4},
		{"first tokens: prefill gone, blocks stay", func() { p.FirstToken(t1, dynT0); p.FirstToken(t2, dynT0) }, 4},
		{"one done: shared blocks stay", func() { p.Done(t1, dynT0) }, 3},
		{"done twice is a no-op", func() { p.Done(t1, dynT0) }, 3},
		{"both done", func() { p.Done(t2, dynT0) }, 0},
	}
	for _, s := range steps {
		s.do()
		if got := dynLoad(p, "a", dynT0); !dynNear(got, s.want) {
			t.Fatalf("%s: load %v, want %v", s.name, got, s.want)
		}
	}
}

func TestDynamoPrefillRelease(t *testing.T) {
	for _, tc := range []struct {
		name       string
		firstChunk bool
		firstToken bool
		afterFirst float64 // A/16 + D after FirstToken (or not)
		activeA    int     // ActivePrefill then
	}{
		{"first token releases prefill", false, true, 2, 0},
		{"first chunk and token (a chat stream)", true, true, 2, 0},
		{"first chunk alone (response.created) keeps A_w", true, false, 32/16.0 + 2, 32},
		{"no first token: prefill held until done", false, false, 32/16.0 + 2, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := dynNew(t, peers.DefaultDynamoConfig())
			tk := dynBook(p, dynReq(32, 1, 2), "a", 0, dynT0)
			if got := p.ActivePrefill("a"); got != 32 {
				t.Fatalf("booked A_w %d, want 32", got)
			}
			if tc.firstChunk {
				p.FirstChunk(tk, dynT0)
			}
			if tc.firstToken {
				p.FirstToken(tk, dynT0)
				p.FirstToken(tk, dynT0) // twice: released once
			}
			if got := dynLoad(p, "a", dynT0); !dynNear(got, tc.afterFirst) {
				t.Fatalf("before done: load %v, want %v", got, tc.afterFirst)
			}
			if got := p.ActivePrefill("a"); got != tc.activeA {
				t.Fatalf("before done: A_w %d, want %d", got, tc.activeA)
			}
			p.Done(tk, dynT0)
			if got := dynLoad(p, "a", dynT0); got != 0 {
				t.Fatalf("after done: load %v, want 0", got)
			}
		})
	}
}

func TestDynamoDispatchedOverlap(t *testing.T) {
	req := dynReq(64, 1, 2, 3, 4)
	cands := []peers.Candidate{dynCand("a", 3, 0, 0), dynCand("b", 1, 0, 0)}
	for _, tc := range []struct {
		name string
		pick *peers.Request // what the last Pick was for; nil: no Pick
		to   string
		want float64 // A/16 + D on to
	}{
		{"same request, chosen", req, "a", (64-48)/16.0 + 4},
		{"same request, another candidate", req, "b", (64-16)/16.0 + 4},
		{"a copy of the request", func() *peers.Request { c := *req; return &c }(), "a", (64-48)/16.0 + 4},
		{"another request: whole prompt", dynReq(64, 7, 8, 9, 10), "a", 64/16.0 + 4},
		{"no pick: whole prompt", nil, "a", 64/16.0 + 4},
		{"not a candidate: whole prompt", req, "c", 64/16.0 + 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := dynNew(t, peers.DefaultDynamoConfig())
			if tc.pick != nil {
				p.Pick(tc.pick, cands, 0, dynT0)
			}
			p.Dispatched(req, tc.to, dynT0)
			if got := dynLoad(p, tc.to, dynT0); !dynNear(got, tc.want) {
				t.Fatalf("load %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDynamoExpiry(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after time.Duration
		via   string // what runs at dynT0+after: "pick" or "dispatched"
		want  float64
	}{
		{"fresh at 3599 s", 3599 * time.Second, "pick", 32/16.0 + 2},
		{"fresh at exactly 3600 s", 3600 * time.Second, "pick", 32/16.0 + 2},
		{"expired at 3601 s, by pick", 3601 * time.Second, "pick", 0},
		{"fresh at 3600 s, by dispatched", 3600 * time.Second, "dispatched", 32/16.0 + 2},
		{"expired at 3601 s, by dispatched", 3601 * time.Second, "dispatched", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := dynNew(t, peers.DefaultDynamoConfig())
			old := dynBook(p, dynReq(32, 1, 2), "a", 0, dynT0)
			now := dynT0.Add(tc.after)
			probe := now
			if tc.via == "dispatched" {
				p.Done(p.Dispatched(dynReq(16, 9), "b", now), now)
				probe = dynT0 // a Pick at dynT0 expires nothing itself
			}
			if got := dynLoad(p, "a", probe); !dynNear(got, tc.want) {
				t.Fatalf("load %v, want %v", got, tc.want)
			}
			// Done on the old booking (expired or not) leaves a newer one.
			fresh := dynBook(p, dynReq(16, 1), "a", 0, now)
			p.Done(old, now)
			if got := dynLoad(p, "a", now); !dynNear(got, 16/16.0+1) {
				t.Fatalf("after the old one's done: load %v, want 2", got)
			}
			p.Done(fresh, now)
		})
	}
}

func TestDynamoSelection(t *testing.T) {
	// Loads: a 96 prefill tokens and 6 blocks, b 32 and 1, c none. For
	// the 64-token, 4-block request, cold costs are a 20, b 11, c 8.
	setup := func(t *testing.T) *peers.DynamoPolicy {
		p := dynNew(t, peers.DefaultDynamoConfig())
		dynBook(p, dynReq(96, 10, 11, 12, 13, 14, 15), "a", 0, dynT0)
		dynBook(p, dynReq(32, 20), "b", 0, dynT0)
		return p
	}
	for _, tc := range []struct {
		name   string
		cands  []peers.Candidate
		want   int
		reason string
	}{
		{"cold prefix: least loaded", []peers.Candidate{dynCand("a", 0, 0, 0), dynCand("b", 0, 0, 0), dynCand("c", 0, 0, 0)}, 2, "cold"},
		{"cold prefix, order aside", []peers.Candidate{dynCand("c", 0, 0, 0), dynCand("a", 0, 0, 0), dynCand("b", 0, 0, 0)}, 0, "cold"},
		{"overlap outweighs load", []peers.Candidate{dynCand("a", 0, 0, 0), dynCand("b", 4, 0, 0), dynCand("c", 0, 0, 0)}, 1, "overlap"},
		{"small overlap loses to load", []peers.Candidate{dynCand("a", 4, 0, 0), dynCand("c", 0, 0, 0)}, 1, "cold"},
		{"host overlap is overlap", []peers.Candidate{dynCand("c", 0, 4, 0), dynCand("b", 0, 0, 0)}, 0, "overlap"},
		{"unhealthy cheapest never chosen", []peers.Candidate{dynCand("a", 0, 0, 0), {ID: "c"}}, 0, "cold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := setup(t)
			for rnd := range uint64(50) {
				ch := p.Pick(dynReq(64, 1, 2, 3, 4), tc.cands, rnd, dynT0)
				if ch.Index != tc.want || ch.Reason != tc.reason {
					t.Fatalf("rnd %d: chose %d (%s), want %d (%s); costs %v", rnd, ch.Index, ch.Reason, tc.want, tc.reason, ch.Scores)
				}
				for i, c := range tc.cands {
					if !c.Healthy && ch.Scores[i] != 0 {
						t.Fatalf("unhealthy %d scored %v", i, ch.Scores[i])
					}
				}
			}
		})
	}
}

func TestDynamoNoneHealthy(t *testing.T) {
	for _, temp := range []float64{0, 1} {
		c := peers.DefaultDynamoConfig()
		c.Temperature = temp
		p := dynNew(t, c)
		for _, cands := range [][]peers.Candidate{nil, {{ID: "a"}, {ID: "b", Matched: [tier.Count]int{4}}}} {
			ch := p.Pick(dynReq(64, 1, 2, 3, 4), cands, 7, dynT0)
			if ch.Index != -1 || ch.Reason != "none_healthy" || len(ch.Scores) != len(cands) {
				t.Errorf("temperature %v, %d candidates: %+v", temp, len(cands), ch)
			}
			for _, s := range ch.Scores {
				if s != 0 {
					t.Errorf("unhealthy scored %v", s)
				}
			}
		}
	}
}

// dynCounts picks n times with rnd 0..n-1 and counts the choices.
func dynCounts(p *peers.DynamoPolicy, cands []peers.Candidate, n int) []int {
	counts := make([]int, len(cands))
	for rnd := range uint64(n) {
		ch := p.Pick(dynReq(64, 1, 2, 3, 4), cands, rnd*0x9e3779b97f4a7c15, dynT0)
		if ch.Index >= 0 {
			counts[ch.Index]++
		}
	}
	return counts
}

func TestDynamoTiesUniform(t *testing.T) {
	p := dynNew(t, peers.DefaultDynamoConfig())
	cands := []peers.Candidate{dynCand("a", 2, 0, 0), {ID: "x", Matched: [tier.Count]int{2}}, dynCand("b", 2, 0, 0), dynCand("c", 2, 0, 0), dynCand("d", 0, 0, 0)}
	const n = 3000
	counts := dynCounts(p, cands, n)
	for _, i := range []int{0, 2, 3} {
		if counts[i] < n/3-150 || counts[i] > n/3+150 {
			t.Errorf("tied candidate %d chosen %d of %d times, want about %d: %v", i, counts[i], n, n/3, counts)
		}
	}
	if counts[1] != 0 || counts[4] != 0 {
		t.Errorf("unhealthy or costlier chosen: %v", counts)
	}
	for rnd := range uint64(100) {
		a := p.Pick(dynReq(64, 1, 2, 3, 4), cands, rnd, dynT0)
		b := p.Pick(dynReq(64, 1, 2, 3, 4), cands, rnd, dynT0)
		if a.Index != b.Index {
			t.Fatalf("rnd %d: %d then %d", rnd, a.Index, b.Index)
		}
	}
}

func TestDynamoTemperature(t *testing.T) {
	// Costs 8, 6, 4 (cold, 2 and 4 device blocks): normalised 1, 0.5, 0.
	cands := []peers.Candidate{dynCand("a", 0, 0, 0), dynCand("b", 2, 0, 0), {ID: "x"}, dynCand("c", 4, 0, 0)}
	softmax := func(temp float64) []float64 {
		w := []float64{math.Exp(-1 / temp), math.Exp(-0.5 / temp), 0, 1}
		sum := w[0] + w[1] + w[3]
		for i := range w {
			w[i] /= sum
		}
		return w
	}
	equal := []peers.Candidate{dynCand("a", 1, 0, 0), dynCand("b", 1, 0, 0), {ID: "x"}, dynCand("c", 1, 0, 0)}
	for _, tc := range []struct {
		name  string
		temp  float64
		cands []peers.Candidate
		want  []float64
	}{
		{"T 1", 1, cands, softmax(1)},
		{"T 0.2", 0.2, cands, softmax(0.2)},
		{"T 100: near uniform", 100, cands, softmax(100)},
		{"T 1e-300: the cheapest", 1e-300, cands, []float64{0, 0, 0, 1}},
		{"all equal: uniform", 1, equal, []float64{1 / 3.0, 1 / 3.0, 0, 1 / 3.0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := peers.DefaultDynamoConfig()
			c.Temperature = tc.temp
			p := dynNew(t, c)
			const n = 10000
			counts := dynCounts(p, tc.cands, n)
			for i, w := range tc.want {
				if math.Abs(float64(counts[i])-w*n) > 0.03*n {
					t.Errorf("candidate %d chosen %d of %d times, want about %.0f: %v", i, counts[i], n, w*n, counts)
				}
			}
			if counts[2] != 0 {
				t.Errorf("unhealthy chosen %d times", counts[2])
			}
		})
	}
}

func TestDynamoForget(t *testing.T) {
	p := dynNew(t, peers.DefaultDynamoConfig())
	ta := dynBook(p, dynReq(32, 1, 2), "a", 0, dynT0)
	tb := dynBook(p, dynReq(32, 1, 2), "b", 0, dynT0)
	p.Forget("a")
	p.Forget("nobody")
	if got := dynLoad(p, "a", dynT0); got != 0 {
		t.Fatalf("forgotten a: load %v, want 0", got)
	}
	p.FirstToken(ta, dynT0)
	p.Done(ta, dynT0)
	if got := dynLoad(p, "a", dynT0); got != 0 {
		t.Fatalf("forgotten a after its done: load %v, want 0", got)
	}
	if got := dynLoad(p, "b", dynT0); !dynNear(got, 2+2) {
		t.Fatalf("b: load %v, want 4", got)
	}
	p.Done(tb, dynT0)
	if got := dynLoad(p, "b", dynT0); got != 0 {
		t.Fatalf("b done: load %v, want 0", got)
	}
}

func FuzzDynamoPick(f *testing.F) {
	f.Add([]byte{3, 1, 0, 2, 9, 0, 0, 1, 200, 4}, uint64(1), 0.0)
	f.Add([]byte{0, 0, 0}, uint64(0), 1.5)
	f.Add([]byte{255, 255, 255, 255, 1, 2, 3, 4, 5, 6, 7, 8}, uint64(42), 1e-9)
	f.Fuzz(func(t *testing.T, data []byte, rnd uint64, temp float64) {
		c := peers.DefaultDynamoConfig()
		if temp >= 0 && temp < 1e6 {
			c.Temperature = temp
		}
		p := dynNew(t, c)
		at := func(i int) int {
			if i < len(data) {
				return int(data[i])
			}
			return 0
		}
		for step := 0; step*8 < len(data) || step == 0; step++ {
			o := step * 8
			req := dynReq(at(o)*3, uint64(at(o+1)%5), uint64(at(o+2)%7))
			req.BlockSize = at(o+3) % 20 // 0 too
			var cands []peers.Candidate
			for i := range at(o+4) % 5 {
				cands = append(cands, peers.Candidate{
					ID:      string(rune('a' + (at(o+5)+i)%4)),
					Healthy: (at(o+6)>>i)&1 == 1,
					Matched: [tier.Count]int{at(o+7+i) - 100, at(o + i), at(o + 2*i)},
				})
			}
			ch := p.Pick(req, cands, rnd+uint64(step), dynT0.Add(time.Duration(at(o))*time.Minute))
			healthy := false
			for _, cd := range cands {
				healthy = healthy || cd.Healthy
			}
			switch {
			case len(ch.Scores) != len(cands):
				t.Fatalf("%d scores for %d candidates", len(ch.Scores), len(cands))
			case !healthy && ch.Index != -1:
				t.Fatalf("none healthy, chose %d", ch.Index)
			case healthy && (ch.Index < 0 || ch.Index >= len(cands) || !cands[ch.Index].Healthy):
				t.Fatalf("chose %d of %+v", ch.Index, cands)
			}
			for _, s := range ch.Scores {
				if math.IsNaN(s) || math.IsInf(s, 0) || s < 0 {
					t.Fatalf("cost %v", s)
				}
			}
			if ch.Index >= 0 {
				tk := p.Dispatched(req, cands[ch.Index].ID, dynT0)
				switch at(o+1) % 3 {
				case 0:
					p.Done(tk, dynT0)
				case 1:
					p.FirstToken(tk, dynT0)
				}
			}
			if at(o+2)%11 == 0 {
				p.Forget("a")
			}
		}
	})
}

func TestDynamoRepeatedKeys(t *testing.T) {
	p := dynNew(t, peers.DefaultDynamoConfig())
	req := dynReq(32, 5, 5)
	if got := p.Pick(req, []peers.Candidate{dynCand("a", 0, 0, 0)}, 0, dynT0).Scores[0]; !dynNear(got, 2+1) {
		t.Fatalf("cost %v, want 3: a repeated key is one new block", got)
	}
	tk := p.Dispatched(req, "a", dynT0)
	if got := dynLoad(p, "a", dynT0); !dynNear(got, 2+1) {
		t.Fatalf("booked: load %v, want 3", got)
	}
	p.Done(tk, dynT0)
	if got := dynLoad(p, "a", dynT0); got != 0 {
		t.Fatalf("done: load %v, want 0", got)
	}
}
