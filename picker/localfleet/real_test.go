package localfleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/localfleet"
	"github.com/kvroute/kvroute/picker/render"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/enginesim"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// collector is this test's own intake of one engine's KV events: a SUB
// socket on the engine's publisher, its batches fed in seq order into the
// in-process fleet; a batch missed live (the subscription joining late,
// a gap) is fetched from the engine's replay ring, as the sidecar does.
type collector struct {
	t       *testing.T
	e       *enginesim.Engine
	url     string
	f       *localfleet.Fleet
	next    atomic.Uint64 // the next seq to apply
	replays atomic.Int64  // replay exchanges
	stop    chan struct{}
	done    chan struct{}
}

// collect starts a collector; it stops when the test ends.
func collect(t *testing.T, e *enginesim.Engine, f *localfleet.Fleet) *collector {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sub, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range []func() error{
		func() error { return sub.SetLinger(0) },
		func() error { return sub.SetRcvhwm(0) },
		func() error { return sub.SetSubscribe("") },
		func() error { return sub.SetRcvtimeo(20 * time.Millisecond) },
		func() error { return sub.Connect(e.EventsEndpoint()) },
	} {
		if err := set(); err != nil {
			t.Fatal(err)
		}
	}
	c := &collector{t: t, e: e, url: e.URL(), f: f, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer func() { sub.Close(); zctx.Term() }()
		c.run(zctx, sub)
	}()
	t.Cleanup(func() { close(c.stop); <-c.done })
	return c
}

func (c *collector) run(zctx *zmq.Context, sub *zmq.Socket) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); { // the test ends first
		select {
		case <-c.stop:
			return
		default:
		}
		frames, err := sub.RecvMessageBytes(0)
		if err != nil { // nothing for a while: catch up with what the engine published
			st, serr := c.e.Stats()
			if serr == nil && st.NextSeq > c.next.Load() && !c.replay(zctx, st.NextSeq) {
				return
			}
			continue
		}
		m, err := kvevents.ParseMessage(frames)
		if err != nil {
			c.t.Errorf("%s: %v", c.url, err)
			return
		}
		if m.Seq > c.next.Load() && !c.replay(zctx, m.Seq) { // missed live
			return
		}
		if m.Seq == c.next.Load() && !c.apply(m.Seq, m.Payload) {
			return
		}
	}
}

// replay applies the ring's batches from the next seq up to before end.
func (c *collector) replay(zctx *zmq.Context, end uint64) bool {
	d, err := zctx.NewSocket(zmq.DEALER)
	if err != nil {
		c.t.Errorf("%s: replay: %v", c.url, err)
		return false
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetRcvtimeo(2 * time.Second)
	if err := d.Connect(c.e.ReplayEndpoint()); err != nil {
		c.t.Errorf("%s: replay: %v", c.url, err)
		return false
	}
	c.replays.Add(1)
	if _, err := d.SendMessage(kvevents.ReplayRequest(c.next.Load())); err != nil {
		c.t.Errorf("%s: replay: %v", c.url, err)
		return false
	}
	for i := 0; i < 100000; i++ { // bounded; the end marker ends it
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			c.t.Errorf("%s: replay: %v", c.url, err)
			return false
		}
		r, err := kvevents.ParseReplayReply(frames)
		if err != nil {
			c.t.Errorf("%s: replay: %v", c.url, err)
			return false
		}
		if r.End {
			break
		}
		if r.Seq < c.next.Load() || r.Seq >= end {
			continue
		}
		if r.Seq != c.next.Load() {
			c.t.Errorf("%s: the replay ring lost batch %d", c.url, c.next.Load())
			return false
		}
		if !c.apply(r.Seq, r.Payload) {
			return false
		}
	}
	return true
}

// apply decodes one batch and hands it to the fleet (Update: routable at
// once; the view lags by its delta interval and stream).
func (c *collector) apply(seq uint64, payload []byte) bool {
	b, err := kvevents.Decode(payload)
	if err != nil {
		c.t.Errorf("%s: batch %d: %v", c.url, seq, err)
		return false
	}
	if err := c.f.Update(c.url, b, time.Now()); err != nil {
		c.t.Errorf("%s: batch %d: %v", c.url, seq, err)
		return false
	}
	c.next.Store(seq + 1)
	return true
}

// send posts a chat body to an engine and waits for the answer.
func send(t *testing.T, url, body string) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, raw)
	}
}

// TestSameAsTheRealFleet: real engines with their sidecars, a fleetview
// watching the sidecars' streams, and an in-process fleet fed the
// engines' own KV events with the same identities. On the same events the
// two match every request chain alike, per tier and endpoint, and the
// router's decision over a snapshot of each is the same.
func TestSameAsTheRealFleet(t *testing.T) {
	const engines = 3
	vcfg := fleetview.DefaultConfig()
	vcfg.Params, vcfg.Retry = summary.ForCapacity(capacity), 50*time.Millisecond
	view, err := fleetview.New(vcfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(view.Close)
	var pods []*testpod.Pod
	for i := 0; i < engines; i++ {
		p := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond})
		view.Watch(p.Sidecar.GRPCAddr())
		pods = append(pods, p)
	}
	// Stop watching before the pods stop (cleanups run last first): a
	// sidecar's Close waits up to 2 s for the summary streams still open
	// (its gRPC server's graceful stop), 6 s for three pods.
	t.Cleanup(view.Close)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if eps := view.Endpoints(); len(eps) < engines {
			return fmt.Errorf("the view knows %d of %d endpoints", len(eps), engines)
		}
		return nil
	})
	local := newFleet(t, nil, nil)
	for _, p := range pods {
		if err := local.Add(endpoint(t, view, p.Engine.URL()).Info, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	// The last engine's events are collected only after its requests
	// ran: they come from its replay ring, the others' live.
	cols := []*collector{collect(t, pods[0].Engine, local), collect(t, pods[1].Engine, local)}
	prompts := workload(t, pods)
	cols = append(cols, collect(t, pods[2].Engine, local))
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error { return caughtUp(pods, cols) })
	if cols[2].replays.Load() == 0 {
		t.Fatal("the late collector caught up without the replay ring")
	}
	ref := endpoint(t, view, pods[0].Engine.URL())
	if g := endpoint(t, local, ref.URL).Group; g != ref.Group {
		t.Fatalf("the in-process fleet puts the engines in group %s, the view in %s", g, ref.Group)
	}
	chains := requestChains(t, ref, prompts)
	// The view follows the sidecars' deltas (every 10 ms) over gRPC: wait
	// until it has caught up — within the bound only if both hold the same
	// summaries.
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		for _, c := range chains {
			for _, tr := range tier.All() {
				if v, l := view.Match(ref.Group, tr, c.keys), local.Match(ref.Group, tr, c.keys); !same(v, l) {
					return fmt.Errorf("%s, %s: the view matches %v, the in-process fleet %v", c.name, tr, v, l)
				}
			}
		}
		return nil
	})
	for _, c := range chains {
		if got := local.Match(ref.Group, tier.GPU, c.keys)[c.sentTo]; c.sentTo != "" && got != len(c.keys) {
			t.Errorf("%s: %s holds %d of its %d blocks", c.name, c.sentTo, got, len(c.keys))
		}
	}
	compareDecisions(t, view, local, ref.Group, chains)
}

// prompt is one chat request; to is the engine it is sent to (-1: none).
type prompt struct {
	system, user, salt string
	to                 int
	url                string // the engine's, once sent
}

func (p prompt) body() string {
	body := map[string]any{"max_tokens": 4, "messages": []map[string]string{
		{"role": "system", "content": p.system}, {"role": "user", "content": p.user}}}
	if p.salt != "" {
		body["cache_salt"] = p.salt
	}
	raw, _ := json.Marshal(body)
	return string(raw)
}

// workload sends the prompts — a shared system prompt, branches of it,
// salted tenants, different lengths — to the engines, and returns them
// with others no engine served.
func workload(t *testing.T, pods []*testpod.Pod) []prompt {
	sys := strings.Repeat("You are a careful assistant for the kvroute project; answer briefly and cite the design. ", 12)
	other := strings.Repeat("You translate French into English, word for word, and nothing else. ", 9)
	prompts := []prompt{
		{sys, "What is a canonical block key?", "", 0, ""},
		{sys, "How does the sidecar handle an engine restart?", "", 0, ""},
		{sys, "What is a canonical block key?", "tenant-a", 1, ""},
		{sys[:len(sys)/2], "Short one.", "", 1, ""},
		{other, "Le chat est sur la table.", "", 2, ""},
		{sys, "What is a canonical block key? And what about its salt, and its model?", "", 2, ""},
		{other, "Le chien dort dans le jardin, sous le grand arbre.", "tenant-b", 2, ""},
		{sys, "A question nobody asked.", "", -1, ""},
		{sys, "What is a canonical block key?", "tenant-z", -1, ""},
		{other, "Le chat est sur la table.", "tenant-a", -1, ""},
		{"Nothing shared here at all, none.", "Hi", "", -1, ""},
	}
	for i, p := range prompts {
		if p.to >= 0 {
			prompts[i].url = pods[p.to].Engine.URL()
			send(t, prompts[i].url, p.body())
		}
	}
	return prompts
}

// caughtUp reports whether every engine is idle and the in-process fleet
// has applied every batch it published.
func caughtUp(pods []*testpod.Pod, cols []*collector) error {
	for i, p := range pods {
		st, err := p.Engine.Stats()
		if err != nil {
			return err
		}
		if st.Running+st.Waiting > 0 {
			return fmt.Errorf("%s: %d requests still in the engine", cols[i].url, st.Running+st.Waiting)
		}
		if got := cols[i].next.Load(); got != st.NextSeq {
			return fmt.Errorf("%s: %d of %d batches applied", cols[i].url, got, st.NextSeq)
		}
	}
	return nil
}

// reqChain is one request's block keys as the picker computes them.
type reqChain struct {
	name   string
	keys   []blockkey.Key
	tokens int
	sentTo string // "" for a request no engine served
}

// requestChains renders each prompt at ref's engine, as the picker does,
// and keys it with ref's model and block size (picker/prepare.go).
func requestChains(t *testing.T, ref fleet.Endpoint, prompts []prompt) []reqChain {
	t.Helper()
	rc := render.New(5*time.Second, 16<<20)
	defer rc.Close()
	var out []reqChain
	for i, p := range prompts {
		r, err := rc.Render(context.Background(), ref.URL, intake.Chat, []byte(p.body()))
		if err != nil {
			t.Fatal(err)
		}
		c := reqChain{name: fmt.Sprintf("prompt %d (%q, salt %q)", i, p.user, p.salt), tokens: len(r.TokenIDs),
			keys: (&blockkey.Request{Tokens: r.TokenIDs, CacheSalt: p.salt}).AppendKeys(nil, ref.Info.Model, ref.Info.BlockSize)}
		c.sentTo = p.url
		out = append(out, c)
	}
	return out
}

// compareDecisions runs the router's decision over a snapshot of the view
// and of the in-process fleet for every chain, at one now, with the same
// loads (the view's, given to the in-process fleet as load reports), and
// wants the same endpoint with the same matched tokens.
func compareDecisions(t *testing.T, view *fleetview.View, local *localfleet.Fleet, group string, chains []reqChain) {
	t.Helper()
	cfg := decide.DefaultConfig()
	credited := 0
	for _, c := range chains {
		now := time.Now()
		veps := view.GroupEndpoints(group)
		for _, e := range veps {
			local.SetLoad(e.URL, e.Load, now)
		}
		leps := local.GroupEndpoints(group)
		if len(veps) != len(leps) {
			t.Fatalf("the view lists %s, the in-process fleet %s", urls(veps), urls(leps))
		}
		req := decide.Request{Request: score.Request{PromptTokens: c.tokens}, BlockSize: bs}
		if len(c.keys) > 0 {
			req.TieKey = uint64(c.keys[0])
		}
		var d [2]decide.Decision
		for i, src := range []struct {
			eps   []fleet.Endpoint
			match func(string, tier.Tier, []blockkey.Key) map[string]int
		}{{veps, view.Match}, {leps, local.Match}} {
			snap := decide.Snapshot{Endpoints: src.eps}
			for _, tr := range tier.All() {
				snap.Matched[tr] = src.match(group, tr, c.keys)
			}
			for _, e := range src.eps {
				if h := e.HealthAt(now, cfg.Health); h.State != fleet.Cached {
					t.Fatalf("%s is %v: no cache credit, the decisions would prove little", e.URL, h)
				}
			}
			d[i] = decide.Decide(&cfg, req, snap, now)
		}
		v, l := d[0], d[1]
		if v.Endpoint != l.Endpoint || v.MatchedTokens != l.MatchedTokens || v.Reason != l.Reason || v.Cached != l.Cached {
			t.Errorf("%s: the view decides %v, the in-process fleet %v", c.name, v, l)
		}
		if v.MatchedTokens > 0 {
			credited++
		}
	}
	if credited < 4 {
		t.Errorf("%d decisions with cached tokens: the comparison proves little", credited)
	}
}
