package inflight

import (
	"math"
	"testing"
	"time"
)

func ledger(t *testing.T, mut func(*Config)) *Ledger {
	t.Helper()
	cfg := DefaultConfig()
	if mut != nil {
		mut(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var t0 = time.Unix(1_000_000, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestPending(t *testing.T) {
	type rec struct {
		ms     int
		tokens float64
	}
	for _, tc := range []struct {
		name     string
		picks    []rec
		reported time.Time
		now      time.Time
		want     Pending
	}{
		{"nothing", nil, time.Time{}, at(0), Pending{}},
		{"one pick, no report yet", []rec{{0, 1000}}, time.Time{}, at(0), Pending{Count: 1, Tokens: 1000}},
		{"aged at the prefill rate", []rec{{0, 1000}}, time.Time{}, at(100), Pending{Count: 1, Tokens: 500}},
		{"aged past zero counts, with no work", []rec{{0, 1000}}, time.Time{}, at(1000), Pending{Count: 1, Tokens: 0}},
		{"negative tokens count as none", []rec{{0, -5}}, time.Time{}, at(0), Pending{Count: 1, Tokens: 0}},
		{"a report after the pick covers it", []rec{{0, 1000}}, at(10), at(20), Pending{}},
		{"a report at the same instant covers it", []rec{{10, 1000}}, at(10), at(20), Pending{}},
		{"a report before the pick does not", []rec{{10, 1000}}, at(5), at(10), Pending{Count: 1, Tokens: 1000}},
		{"older than Forget is dropped", []rec{{0, 1000}, {25_000, 100}}, time.Time{}, at(30_001), Pending{Count: 1, Tokens: 0}},
		{"exactly Forget still counts", []rec{{0, 10}}, time.Time{}, at(30_000), Pending{Count: 1, Tokens: 0}},
		{"several, some covered", []rec{{0, 100}, {50, 1000}, {60, 1000}}, at(40), at(60), Pending{Count: 2, Tokens: 1950}},
	} {
		l := ledger(t, nil)
		for _, p := range tc.picks {
			l.Record("a", p.tokens, at(p.ms))
		}
		got := l.Pending("a", tc.reported, tc.now)
		if got.Count != tc.want.Count || math.Abs(got.Tokens-tc.want.Tokens) > 1e-9 {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		if other := l.Pending("b", time.Time{}, tc.now); other != (Pending{}) {
			t.Errorf("%s: another endpoint has %+v", tc.name, other)
		}
	}
}

func TestPendingDropsWhatItForgets(t *testing.T) {
	l := ledger(t, nil)
	l.Record("a", 100, at(0))
	l.Record("a", 100, at(10))
	if p := l.Pending("a", at(5), at(20)); p.Count != 1 {
		t.Fatalf("%+v", p)
	}
	// The covered pick is gone for good: an older report does not bring it back.
	if p := l.Pending("a", time.Time{}, at(20)); p.Count != 1 {
		t.Fatalf("a covered pick came back: %+v", p)
	}
	if p := l.Pending("a", at(10), at(20)); p.Count != 0 || len(l.sends) != 0 {
		t.Fatalf("after the last is covered: %+v, %d endpoints kept", p, len(l.sends))
	}
}

func TestDone(t *testing.T) {
	l := ledger(t, nil)
	a1 := l.Record("a", 100, at(0))
	a2 := l.Record("a", 200, at(0))
	b1 := l.Record("b", 300, at(0))
	if a1 == a2 || a2 == b1 || a1 == b1 {
		t.Fatalf("ids repeat: %d %d %d", a1, a2, b1)
	}
	l.Done("a", a1)
	l.Done("a", a1)  // twice: ignored
	l.Done("a", b1)  // another endpoint's id: ignored
	l.Done("c", 999) // unknown: ignored
	if p := l.Pending("a", time.Time{}, at(0)); p != (Pending{Count: 1, Tokens: 200}) {
		t.Fatalf("a: %+v", p)
	}
	if p := l.Pending("b", time.Time{}, at(0)); p != (Pending{Count: 1, Tokens: 300}) {
		t.Fatalf("b: %+v", p)
	}
}

func TestPerEndpointBound(t *testing.T) {
	l := ledger(t, func(c *Config) { c.PerEndpoint = 3 })
	first := l.Record("a", 1, at(0))
	for i := 1; i < 5; i++ {
		l.Record("a", float64(1+i), at(0))
	}
	if p := l.Pending("a", time.Time{}, at(0)); p.Count != 3 || p.Tokens != 3+4+5 {
		t.Fatalf("bounded ledger: %+v", p)
	}
	l.Done("a", first) // long dropped: ignored
	if p := l.Pending("a", time.Time{}, at(0)); p.Count != 3 {
		t.Fatalf("%+v", p)
	}
}

func TestConfig(t *testing.T) {
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"zero rate":         func(c *Config) { c.PrefillTokensPerSecond = 0 },
		"NaN rate":          func(c *Config) { c.PrefillTokensPerSecond = math.NaN() },
		"zero forget":       func(c *Config) { c.Forget = 0 },
		"zero per-endpoint": func(c *Config) { c.PerEndpoint = 0 },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if _, err := New(c); err == nil {
			t.Errorf("%s: New accepted", name)
		}
	}
	if _, err := New(Config{}); err == nil {
		t.Error("the zero Config was accepted")
	}
}
