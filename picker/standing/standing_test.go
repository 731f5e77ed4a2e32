package standing

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func ledger(t *testing.T, cfg Config) *Ledger {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestStandingOnLoads: keys sending at given periods (equal costs) for
// 60 s; after a 20 s warm-up, how many of each key's requests were judged
// beyond their share.
func TestStandingOnLoads(t *testing.T) {
	type sender struct {
		key    string
		period time.Duration
		cost   float64
		from   time.Duration // starts sending
	}
	for _, c := range []struct {
		name    string
		senders []sender
		beyond  map[string]string // key → "none", "all" or "some"
		ahead   []string          // the keys all of whose requests go ahead (the others: none)
	}{
		{"one key alone is never beyond", []sender{{"a", 100 * time.Millisecond, 2000, 0}}, map[string]string{"a": "none"}, nil},
		{"two alike are both within", []sender{{"a", 250 * time.Millisecond, 2000, 0}, {"b", 250 * time.Millisecond, 2000, 0}},
			map[string]string{"a": "none", "b": "none"}, nil},
		{"ten to one: the heavy beyond, the light within", []sender{{"heavy", 100 * time.Millisecond, 2000, 0}, {"light", time.Second, 2000, 0}},
			map[string]string{"heavy": "all", "light": "none"}, []string{"light"}},
		{"ten to one, the light arriving late", []sender{{"heavy", 100 * time.Millisecond, 2000, 0}, {"light", time.Second, 2000, 15 * time.Second}},
			map[string]string{"heavy": "all", "light": "none"}, []string{"light"}},
		{"same rate, ten times the tokens", []sender{{"big", 500 * time.Millisecond, 20000, 0}, {"small", 500 * time.Millisecond, 2000, 0}},
			map[string]string{"big": "all", "small": "none"}, []string{"small"}},
		{"three keys, one at twice the others", []sender{{"a", 200 * time.Millisecond, 2000, 0}, {"b", 400 * time.Millisecond, 2000, 0}, {"c", 400 * time.Millisecond, 2000, 0}},
			map[string]string{"a": "all", "b": "none", "c": "none"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := ledger(t, DefaultConfig())
			t0 := time.Unix(1000, 0)
			next := make([]time.Duration, len(c.senders))
			for i, s := range c.senders {
				next[i] = s.from
			}
			beyond, ahead, total := map[string]int{}, map[string]int{}, map[string]int{}
			for n := 0; n < 100_000; n++ {
				i := 0
				for j := range next {
					if next[j] < next[i] {
						i = j
					}
				}
				at := next[i]
				if at > 60*time.Second {
					break
				}
				s := c.senders[i]
				st := l.Charge(s.key, s.cost, t0.Add(at))
				if at >= s.from+20*time.Second {
					total[s.key]++
					if st.Beyond {
						beyond[s.key]++
					}
					if st.Ahead {
						ahead[s.key]++
					}
				}
				next[i] += s.period
			}
			for key, want := range c.beyond {
				got := "some"
				switch beyond[key] {
				case 0:
					got = "none"
				case total[key]:
					got = "all"
				}
				if total[key] == 0 || got != want {
					t.Errorf("%s: %d of %d beyond (%s), want %s", key, beyond[key], total[key], got, want)
				}
				if want := slices.Contains(c.ahead, key); (want && ahead[key] != total[key]) || (!want && ahead[key] != 0) {
					t.Errorf("%s: %d of %d ahead, want all: %v", key, ahead[key], total[key], want)
				}
			}
		})
	}
}

// TestStandingForgets: a key idle past the window is forgotten (its next
// request is its first again), its use leaves the share, and the keys
// kept never pass MaxKeys.
func TestStandingForgets(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxKeys = 3
	l := ledger(t, cfg)
	t0 := time.Unix(1000, 0)
	for i := 0; i < 50; i++ {
		l.Charge("heavy", 5000, t0.Add(time.Duration(i)*100*time.Millisecond))
		l.Charge("light", 100, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	if st := l.Charge("heavy", 5000, t0.Add(5*time.Second)); !st.Beyond || st.Keys != 2 {
		t.Fatalf("heavy beside light: %+v", st)
	}
	// The light key goes quiet past the window: the heavy one is alone,
	// within its share.
	at := t0.Add(5*time.Second + cfg.Window + time.Second)
	if st := l.Charge("heavy", 5000, at); st.Beyond || st.Keys != 1 {
		t.Fatalf("heavy alone: %+v", st)
	}
	if st := l.Charge("light", 100, at); st.Use != 0 || st.Beyond {
		t.Fatalf("light back: %+v, want a first request", st)
	}
	for i := 0; i < 10; i++ {
		l.Charge(fmt.Sprint("k", i), 1, at)
		if l.Keys() > cfg.MaxKeys {
			t.Fatalf("%d keys kept, at most %d", l.Keys(), cfg.MaxKeys)
		}
	}
	// Everyone idle past the window: nothing kept, a negative or NaN cost
	// charges nothing.
	late := at.Add(2 * cfg.Window)
	if st := l.Charge("x", -5, late); st.Keys != 1 || st.Use != 0 {
		t.Fatalf("after the window: %+v", st)
	}
	if st := l.Charge("x", 0, late); st.Use != 0 || st.Share != 0 {
		t.Fatalf("no cost charged: %+v", st)
	}
}

// TestPriority: the band outranks the standing; lower runs first.
func TestPriority(t *testing.T) {
	for _, c := range []struct {
		band   int
		beyond bool
		want   int
	}{
		{0, false, 0}, {0, true, 1}, {1, false, -2}, {1, true, -1}, {-1, false, 2}, {-1, true, 3},
		{500, false, -200}, {-500, true, 201},
	} {
		if got := Priority(c.band, Standing{Beyond: c.beyond}); got != c.want {
			t.Errorf("band %d beyond %v: %d, want %d", c.band, c.beyond, got, c.want)
		}
	}
	// Any band above another runs first, whatever the standings.
	if Priority(1, Standing{Beyond: true}) >= Priority(0, Standing{}) {
		t.Fatal("a higher band beyond its share must still run before a lower one within it")
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{{}, {HalfLife: time.Second, Window: time.Second, Slack: -1, MaxKeys: 1}, {HalfLife: time.Second, Window: time.Second, MaxKeys: 0}} {
		if c.Validate() == nil {
			t.Errorf("%+v: valid", c)
		}
	}
}
