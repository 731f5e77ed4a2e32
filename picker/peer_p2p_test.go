package picker

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/peers"
	"github.com/kvroute/kvroute/picker/score"
)

// p2pRouter is a router running the peer policy name, as far as
// peerDecide needs one (score.ParsePolicy does not list the arms yet, so
// NewRouter cannot be asked for them).
func p2pRouter(t *testing.T, name string) *Router {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Score.Policy = score.Policy(name)
	pp, err := newPeerPolicy(name, 7)
	if err != nil {
		t.Fatal(err)
	}
	r := &Router{cfg: cfg, dcfg: decide.Config{Score: cfg.Score, Health: cfg.Health, Predict: cfg.Predict}}
	r.bookings.peer = pp
	return r
}

// p2pPrepared is a request of blocks 16-token blocks (its tokens and its
// keys) to the endpoints urls, and a snapshot of them holding nothing.
func p2pPrepared(blocks int, urls ...string) (*Prepared, decide.Snapshot) {
	chain := make([]blockkey.Key, blocks)
	for i := range chain {
		chain[i] = blockkey.Key(1000 + i)
	}
	tokens := make([]uint32, blocks*16)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	eps := make([]*fleet.Endpoint, len(urls))
	for i, u := range urls {
		eps[i] = &fleet.Endpoint{URL: u, Group: "g", Info: fleet.Identity{Model: "m"}}
	}
	p := &Prepared{req: &intake.Request{Kind: intake.Chat, Model: "m"}, group: "g", ro: fleet.NewRoster(eps), chain: chain, tokens: tokens,
		dreq: decide.Request{Request: score.Request{PromptTokens: blocks * 16}, BlockSize: 16}}
	return p, decide.Snapshot{Roster: p.ro}
}

// TestPeerArmSourceReachesDecision: a peer arm's Choice.Source becomes
// the decision's Source, with SourceTokens the fleet index's CPU prefix
// on the source beyond the chosen endpoint's longest; an arm that names
// none leaves both empty.
func TestPeerArmSourceReachesDecision(t *testing.T) {
	const a, b, c = "http://a:8000", "http://b:8000", "http://c:8000"
	cases := []struct {
		name       string
		policy     string
		blocks     int            // the prompt's
		gpu, cpu   map[string]int // leading blocks held, per endpoint
		wantChosen string
		wantSource string
		wantTokens int
	}{
		// llm-d-precise: a scores 2·700/1000 + 2, b 2·int(0.8·860)/1000 + 2:
		// a. b's CPU run beats a's by 160 blocks, 2,560 tokens ≥ 2,048.
		{"llm-d-precise+p2p names the CPU holder", peers.LLMDPreciseP2P, 1000,
			map[string]int{a: 700}, map[string]int{b: 860}, a, b, 160 * 16},
		// 100 blocks, 1,600 tokens: under 2,048, no pull.
		{"llm-d-precise+p2p under its threshold", peers.LLMDPreciseP2P, 1000,
			map[string]int{a: 700}, map[string]int{b: 800}, a, "", 0},
		// llm-d-precise alone, the same inputs: no source rule.
		{"llm-d-precise names none", peers.LLMDPrecise, 1000,
			map[string]int{a: 700}, map[string]int{b: 860}, a, "", 0},
		// Dynamo: a's credit 10 beats b's 0.75·12 = 9; b's CPU run, 12,
		// is longer than a's 10: the hint names b, 2 blocks beyond.
		{"dynamo+hint names the longer CPU prefix", peers.DynamoHint, 20,
			map[string]int{a: 10}, map[string]int{b: 12}, a, b, 2 * 16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := p2pRouter(t, tc.policy)
			p, snap := p2pPrepared(tc.blocks, a, b, c)
			snap.Matched[tier.GPU], snap.Matched[tier.CPU] = tc.gpu, tc.cpu
			d, ticket := r.peerDecide(p, snap, time.Unix(1_700_000_000, 0))
			if !ticket.ok || d.Endpoint != tc.wantChosen {
				t.Fatalf("chose %q (booked %v), want %q", d.Endpoint, ticket.ok, tc.wantChosen)
			}
			if d.Source != tc.wantSource || d.SourceTokens != tc.wantTokens {
				t.Fatalf("source %q, %d tokens; want %q, %d", d.Source, d.SourceTokens, tc.wantSource, tc.wantTokens)
			}
		})
	}
}

// TestPeerSource: only a healthy candidate of the group other than the
// chosen one becomes the decision's source; its tokens are its CPU run
// beyond the chosen one's longest run on any tier, at least 0.
func TestPeerSource(t *testing.T) {
	cand := func(id string, healthy bool, gpu, cpu, storage int) score.Candidate {
		c := score.Candidate{ID: id, Healthy: healthy}
		c.Matched[tier.GPU], c.Matched[tier.CPU], c.Matched[tier.Storage] = gpu, cpu, storage
		return c
	}
	cands := []score.Candidate{
		cand("a", true, 320, 0, 0),
		cand("b", true, 0, 1024, 0),
		cand("c", false, 0, 2048, 0),
		cand("d", true, 0, 160, 640), // the chosen one in some cases: its storage run counts
		cand("e", true, 0, 0, 0),
	}
	cases := []struct {
		name   string
		ch     peers.Choice
		ok     bool
		j, tok int
	}{
		{"a source beyond the chosen GPU run", peers.Choice{Index: 0, Source: "b"}, true, 1, 1024 - 320},
		{"the chosen one's longest tier counts", peers.Choice{Index: 3, Source: "b"}, true, 1, 1024 - 640},
		{"a source holding less: 0 tokens, still named", peers.Choice{Index: 0, Source: "e"}, true, 4, 0},
		{"none named", peers.Choice{Index: 0}, false, 0, 0},
		{"the chosen one itself", peers.Choice{Index: 1, Source: "b"}, false, 0, 0},
		{"an unhealthy one", peers.Choice{Index: 0, Source: "c"}, false, 0, 0},
		{"not of the group", peers.Choice{Index: 0, Source: "z"}, false, 0, 0},
		{"nothing chosen", peers.Choice{Index: -1, Source: "b"}, false, 0, 0},
	}
	for _, tc := range cases {
		j, tok, ok := peerSource(cands, tc.ch)
		if ok != tc.ok || ok && (j != tc.j || tok != tc.tok) {
			t.Errorf("%s: %d, %d, %v; want %d, %d, %v", tc.name, j, tok, ok, tc.j, tc.tok, tc.ok)
		}
	}
}

// TestPeerArmThresholds: the router sets an llm-d arm's source threshold
// and llm-d+p2p's load gate, and refuses either for a policy without it.
func TestPeerArmThresholds(t *testing.T) {
	r := p2pRouter(t, peers.LLMDLoadP2P)
	if err := r.SetMinCachedTokenDelta(8192); err != nil {
		t.Fatal(err)
	}
	var got int
	r.WithPeerPolicy(func(p peers.Policy) { got = p.(peers.SourceThreshold).MinCachedTokenDelta() })
	if got != 8192 {
		t.Fatalf("threshold %d after setting 8192", got)
	}
	if r.SetMinCachedTokenDelta(0) == nil {
		t.Fatal("a threshold of 0 accepted")
	}
	if r.SetLLMDLoadGate(1000, time.Second) == nil {
		t.Fatal("llm-d-load+p2p took a load gate")
	}
	r = p2pRouter(t, peers.LLMDP2P)
	if err := r.SetLLMDLoadGate(1000, time.Second); err != nil {
		t.Fatalf("llm-d+p2p refused its load gate: %v", err)
	}
	var peak, ms float64
	r.WithPeerPolicy(func(p peers.Policy) { peak, ms = p.(*peers.LLMDP2PPolicy).LoadGate() })
	if peak != 1000 || ms != 1000 {
		t.Fatalf("load gate %v, %v", peak, ms)
	}
	if r = p2pRouter(t, peers.DynamoHint); r.SetMinCachedTokenDelta(2048) == nil {
		t.Fatal("dynamo+hint took a threshold")
	}
}
