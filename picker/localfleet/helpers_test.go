package localfleet_test

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/localfleet"
)

// The in-process fleet is a picker.Fleet, as fleetview.View is.
var _ picker.Fleet = (*localfleet.Fleet)(nil)

const (
	model    = "Qwen/Qwen3-0.6B"
	bs       = 16 // block size
	capacity = 4096
)

// t0 is the virtual clock's start in the tests that drive one.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// clock is a settable virtual clock.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time                { return c.now }
func (c *clock) add(d time.Duration) time.Time { c.now = c.now.Add(d); return c.now }

// newFleet returns a fleet on c's clock (nil: the wall clock) with cfg
// adjusted by adjust.
func newFleet(t *testing.T, c *clock, adjust func(*localfleet.Config)) *localfleet.Fleet {
	t.Helper()
	cfg := localfleet.DefaultConfig()
	cfg.Params = summary.ForCapacity(capacity)
	if c != nil {
		cfg.Clock = c.Now
	}
	if adjust != nil {
		adjust(&cfg)
	}
	f, err := localfleet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// ident is an engine at url serving m with block size b.
func ident(url, m string, b int) fleet.Identity {
	return fleet.Identity{Endpoint: url, Model: m, BlockSize: b, NumGPUBlocks: 1024, HashAlgo: "sha256_cbor",
		TokenizerFingerprint: "fp-" + m}
}

// add adds the engines and fails the test on an error.
func add(t *testing.T, f *localfleet.Fleet, now time.Time, ids ...fleet.Identity) {
	t.Helper()
	for _, id := range ids {
		if err := f.Add(id, now); err != nil {
			t.Fatal(err)
		}
	}
}

// toks returns n tokens base, base+1, ….
func toks(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// cat joins token runs.
func cat(runs ...[]uint32) []uint32 {
	var out []uint32
	for _, r := range runs {
		out = append(out, r...)
	}
	return out
}

// hashes returns n engine hashes from first: the engine's identities of
// the blocks, opaque to the index.
func hashes(first uint64, n int) []kvevents.Hash {
	out := make([]kvevents.Hash, n)
	for i := range out {
		out[i] = kvevents.IntHash(first + uint64(i))
	}
	return out
}

// stored is a BlockStored run of the tokens' full blocks on medium,
// hashed from first, after the block hashed parent (0: from token 0),
// salted when salt is set (extra_keys[0] of a run from token 0).
func stored(medium string, first, parent uint64, salt string, tokens []uint32, b int) kvevents.Event {
	n := len(tokens) / b
	ev := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: hashes(first, n), TokenIDs: tokens[:n*b],
		BlockSize: b, Medium: medium}
	if parent != 0 {
		ev.ParentBlockHash, ev.HasParent = kvevents.IntHash(parent), true
	}
	if salt != "" {
		ev.ExtraKeys = make([][]any, n)
		ev.ExtraKeys[0] = []any{salt}
	}
	return ev
}

// removed is a BlockRemoved of the blocks hashed first.. on medium.
func removed(medium string, first uint64, n int) kvevents.Event {
	return kvevents.Event{Type: kvevents.TypeBlockRemoved, BlockHashes: hashes(first, n), Medium: medium}
}

func cleared() kvevents.Event { return kvevents.Event{Type: kvevents.TypeAllBlocksCleared} }

func batch(evs ...kvevents.Event) *kvevents.Batch { return &kvevents.Batch{Events: evs} }

// chain keys a request's tokens as the picker does (picker/prepare.go).
func chain(m string, b int, salt string, tokens []uint32) []blockkey.Key {
	return (&blockkey.Request{Tokens: tokens, CacheSalt: salt}).AppendKeys(nil, m, b)
}

// same compares two matches, nil and empty alike.
func same(a, b map[string]int) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return maps.Equal(a, b)
}

// groupOf returns url's identity group in f.
func groupOf(t *testing.T, f *localfleet.Fleet, url string) string {
	t.Helper()
	for _, e := range f.Endpoints() {
		if e.URL == url {
			return e.Group
		}
	}
	t.Fatalf("the fleet does not hold %s", url)
	return ""
}

// endpoint returns url's endpoint in f (a localfleet.Fleet, a
// fleetview.View).
func endpoint(t *testing.T, f interface{ Endpoints() []fleet.Endpoint }, url string) fleet.Endpoint {
	t.Helper()
	for _, e := range f.Endpoints() {
		if e.URL == url {
			return e
		}
	}
	t.Fatalf("the fleet does not hold %s", url)
	return fleet.Endpoint{}
}

func urls(eps []fleet.Endpoint) string {
	out := ""
	for _, e := range eps {
		out += fmt.Sprintf("%s ", e.URL)
	}
	return out
}
