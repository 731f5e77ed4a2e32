package admit

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestSaturated(t *testing.T) {
	cfg := DefaultConfig()
	hot := Load{Queued: 5}
	for _, tc := range []struct {
		name  string
		cfg   func(*Config)
		loads []Load
		want  bool
	}{
		{"no endpoint is not overload", nil, nil, false},
		{"one idle", nil, []Load{{}}, false},
		{"waiting at the limit", nil, []Load{{Queued: 5}}, true},
		{"waiting below the limit", nil, []Load{{Queued: 4.9}}, false},
		{"kv usage at the limit", nil, []Load{{KVUsage: 0.95}}, true},
		{"kv usage below", nil, []Load{{KVUsage: 0.94}}, false},
		{"prefill tokens at the limit", nil, []Load{{PrefillTokens: 2048}}, true},
		{"prefill tokens below", nil, []Load{{PrefillTokens: 2047}}, false},
		{"every endpoint saturated, each by another signal", nil, []Load{hot, {KVUsage: 1}, {PrefillTokens: 1e6}}, true},
		{"one endpoint with room", nil, []Load{hot, hot, {Queued: 2}}, false},
		{"waiting limit off", func(c *Config) { c.MaxWaiting = 0 }, []Load{{Queued: 1e9}}, false},
		{"kv limit off", func(c *Config) { c.MaxKVUsage = 0 }, []Load{{KVUsage: 1}}, false},
		{"prefill limit off", func(c *Config) { c.MaxPrefillTokens = 0 }, []Load{{PrefillTokens: 1e9}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			if tc.cfg != nil {
				tc.cfg(&c)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := c.Saturated(tc.loads); got != tc.want {
				t.Fatalf("Saturated(%+v) = %v, want %v", tc.loads, got, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	good := DefaultConfig()
	if err := good.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.MaxWaiting = -1 }, "--saturation-waiting"},
		{func(c *Config) { c.MaxKVUsage = 1.5 }, "--saturation-kv-usage"},
		{func(c *Config) { c.MaxPrefillTokens = -3 }, "--saturation-prefill-tokens"},
		{func(c *Config) { c.QueueSize = -1 }, "--queue-size"},
		{func(c *Config) { c.QueueTimeout = 0 }, "--queue-timeout"},
		{func(c *Config) { c.StandingTimeout = 100 * time.Millisecond }, "--queue-standing-timeout"},
		{func(c *Config) { c.LIFOAfter = -1 }, "--queue-lifo-after"},
	} {
		c := DefaultConfig()
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want an error naming %s", err, tc.want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		queued int
		rate   float64
		want   time.Duration
	}{
		{0, 0, 60 * time.Second},
		{10, 0, 60 * time.Second},
		{0, 100, time.Second},
		{99, 10, 10 * time.Second},
		{1000, 1, 60 * time.Second},
		{5, 2, 3 * time.Second},
	} {
		if got := RetryAfter(tc.queued, tc.rate); got != tc.want {
			t.Errorf("RetryAfter(%d, %v) = %v, want %v", tc.queued, tc.rate, got, tc.want)
		}
	}
}

// order pops every waiter and lists their IDs.
func order(q *Queue) []uint64 {
	var out []uint64
	for {
		w, ok := q.Pop(t0)
		if !ok {
			return out
		}
		out = append(out, w.ID)
	}
}

func push(t *testing.T, q *Queue, ws ...Waiter) {
	t.Helper()
	for _, w := range ws {
		if _, _, ok := q.Push(w); !ok {
			t.Fatalf("Push(%+v) refused", w)
		}
	}
}

func TestReleaseOrder(t *testing.T) {
	w := func(id uint64, key string, prio int, cost float64) Waiter {
		return Waiter{ID: id, Key: key, Priority: prio, Cost: cost, Deadline: t0.Add(time.Minute)}
	}
	for _, tc := range []struct {
		name string
		in   []Waiter
		want []uint64
	}{
		{"one key is first come first served", []Waiter{w(1, "a", 0, 10), w(2, "a", 0, 10), w(3, "a", 0, 10)}, []uint64{1, 2, 3}},
		{"a burst does not hold back a key arriving after it",
			[]Waiter{w(1, "heavy", 0, 100), w(2, "heavy", 0, 100), w(3, "heavy", 0, 100), w(4, "heavy", 0, 100), w(5, "light", 0, 100)},
			[]uint64{1, 5, 2, 3, 4}},
		{"two keys alternate at equal cost",
			[]Waiter{w(1, "a", 0, 10), w(2, "a", 0, 10), w(3, "a", 0, 10), w(4, "b", 0, 10), w(5, "b", 0, 10), w(6, "b", 0, 10)},
			[]uint64{1, 4, 2, 5, 3, 6}},
		{"weighted by tokens: a long prompt waits for the short ones its cost covers",
			[]Waiter{w(1, "long", 0, 400), w(2, "long", 0, 400), w(3, "short", 0, 100), w(4, "short", 0, 100), w(5, "short", 0, 100), w(6, "short", 0, 100), w(7, "short", 0, 100)},
			[]uint64{1, 3, 4, 5, 6, 2, 7}},
		{"a higher band goes first, whatever arrived before",
			[]Waiter{w(1, "a", 0, 1), w(2, "a", -1, 1), w(3, "b", 2, 1000), w(4, "a", 1, 1)},
			[]uint64{3, 4, 1, 2}},
		{"fairness holds within a band",
			[]Waiter{w(1, "a", 1, 10), w(2, "a", 1, 10), w(3, "b", 1, 10), w(4, "c", 0, 10)},
			[]uint64{1, 3, 2, 4}},
		{"a cost below 1 or not a number counts as 1",
			[]Waiter{w(1, "a", 0, 0), w(2, "a", 0, -5), w(3, "b", 0, 1.5)},
			[]uint64{1, 3, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := NewQueue(64, 0)
			push(t, q, tc.in...)
			if q.Len() != len(tc.in) {
				t.Fatalf("Len = %d, want %d", q.Len(), len(tc.in))
			}
			if got := order(q); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("released %v, want %v", got, tc.want)
			}
			if q.Len() != 0 || len(q.bands) != 0 || len(q.where) != 0 {
				t.Fatalf("after draining: len %d, bands %d, index %d", q.Len(), len(q.bands), len(q.where))
			}
		})
	}
}

// TestTenFoldTenant is the fairness target in miniature: with one key
// sending ten times the other's requests, both backlogged, each gets half
// of the releases while both wait.
func TestTenFoldTenant(t *testing.T) {
	q := NewQueue(1<<12, 0)
	id := uint64(0)
	add := func(key string, n int) {
		for i := 0; i < n; i++ {
			id++
			push(t, q, Waiter{ID: id, Key: key, Cost: 500, Deadline: t0.Add(time.Minute)})
		}
	}
	add("heavy", 1000)
	add("light", 100)
	light := 0
	for i := 0; i < 200; i++ {
		w, _ := q.Pop(t0)
		if w.Key == "light" {
			light++
		}
	}
	if light != 100 {
		t.Fatalf("the light key got %d of the first 200 releases, want 100 (half)", light)
	}
}

// TestIdleKeyHasNoCredit: a key that was away does not jump ahead for
// the service it did not use, and a key served alone carries no debt into
// a busy period after the queue emptied.
func TestIdleKeyHasNoCredit(t *testing.T) {
	q := NewQueue(64, 0)
	id := uint64(0)
	add := func(key string, n int) {
		for i := 0; i < n; i++ {
			id++
			push(t, q, Waiter{ID: id, Key: key, Cost: 10, Deadline: t0.Add(time.Minute)})
		}
	}
	keys := func(n int) string {
		var got []string
		for i := 0; i < n; i++ {
			w, ok := q.Pop(t0)
			if !ok {
				break
			}
			got = append(got, w.Key)
		}
		return strings.Join(got, " ")
	}
	add("a", 5)
	keys(3) // a is served alone for a while
	add("c", 3)
	if got, want := keys(10), "c a c a c"; got != want {
		t.Fatalf("after a was served alone: released %q, want %q (c starts at the virtual time, not before it)", got, want)
	}
	add("a", 6)
	keys(6) // the queue empties
	add("a", 2)
	add("b", 2)
	if got, want := keys(10), "a b a b"; got != want {
		t.Fatalf("after the queue emptied: released %q, want %q (no debt)", got, want)
	}
}

// TestLIFOKeepsFairness: a heavy key served newest first (its backlog
// stands) still advances the virtual time, so a light key arriving now
// and then goes within a release or two each time, and the heavy key's
// backlog is not starved either.
func TestLIFOKeepsFairness(t *testing.T) {
	q := NewQueue(1<<12, 250*time.Millisecond)
	id := uint64(0)
	add := func(key string, at time.Time) {
		id++
		push(t, q, Waiter{ID: id, Key: key, Cost: 2000, Arrived: at, Deadline: at.Add(time.Hour)})
	}
	for i := 0; i < 200; i++ {
		add("heavy", t0)
	}
	now := t0.Add(10 * time.Second) // the heavy backlog stands: LIFO
	for round := 0; round < 20; round++ {
		add("light", now)
		for i := 0; i < 3; i++ { // heavy keeps arriving at ten times the rate
			add("heavy", now)
		}
		waited := 0
		for {
			w, ok := q.Pop(now)
			if !ok {
				t.Fatal("the queue emptied")
			}
			waited++
			if w.Key == "light" {
				break
			}
			if waited > 2 {
				t.Fatalf("round %d: the light key waited behind %d heavy releases", round, waited-1)
			}
		}
		now = now.Add(100 * time.Millisecond)
	}
}

func TestFullQueue(t *testing.T) {
	w := func(id uint64, key string, prio int) Waiter {
		return Waiter{ID: id, Key: key, Priority: prio, Cost: 1, Deadline: t0.Add(time.Minute)}
	}
	q := NewQueue(4, 0)
	push(t, q, w(1, "a", 0), w(2, "heavy", -1), w(3, "heavy", -1), w(4, "light", -1))
	// Full: the lowest band makes room, from the key furthest ahead of
	// its share (heavy), its oldest.
	out, displaced, ok := q.Push(w(5, "light", -1))
	if !ok || !displaced || out.ID != 2 {
		t.Fatalf("Push(same band) = %+v, %v, %v; want heavy's oldest (2) displaced", out, displaced, ok)
	}
	// Now light (4, 5) is ahead of heavy (3): its oldest makes room.
	out, displaced, ok = q.Push(w(6, "b", 1))
	if !ok || !displaced || out.ID != 4 {
		t.Fatalf("Push(higher band) = %+v, %v, %v; want light's oldest (4) displaced", out, displaced, ok)
	}
	if _, _, ok := q.Push(w(6, "c", 2)); ok {
		t.Fatal("a duplicate ID was taken")
	}
	if got := order(q); fmt.Sprint(got) != "[6 1 3 5]" {
		t.Fatalf("released %v, want [6 1 3 5]", got)
	}
	// Every waiter of a higher band than the newcomer's: it is refused.
	q = NewQueue(1, 0)
	push(t, q, w(1, "a", 3))
	if _, _, ok := q.Push(w(2, "b", 0)); ok {
		t.Fatal("a full queue of higher bands took a lower one")
	}
	if _, _, ok := NewQueue(0, 0).Push(w(1, "a", 0)); ok {
		t.Fatal("a queue of size 0 took a waiter")
	}
}

// TestLIFOWhenStanding: once a key's oldest waiter has waited lifoAfter,
// its newest goes first; fairness between keys holds.
func TestLIFOWhenStanding(t *testing.T) {
	q := NewQueue(16, 250*time.Millisecond)
	at := func(id uint64, key string, ms int) Waiter {
		return Waiter{ID: id, Key: key, Cost: 10, Arrived: t0.Add(time.Duration(ms) * time.Millisecond), Deadline: t0.Add(time.Minute)}
	}
	push(t, q, at(1, "a", 0), at(2, "a", 10), at(3, "a", 20), at(4, "b", 30))
	now := t0.Add(100 * time.Millisecond) // a burst: arrival order
	if w, _ := q.Pop(now); w.ID != 1 {
		t.Fatalf("within lifoAfter: released %d, want 1", w.ID)
	}
	now = t0.Add(time.Second) // the queue stands: newest first, keys still take turns
	var got []uint64
	for {
		w, ok := q.Pop(now)
		if !ok {
			break
		}
		got = append(got, w.ID)
	}
	if fmt.Sprint(got) != "[4 3 2]" {
		t.Fatalf("standing queue released %v, want [4 3 2] (b's turn, then a newest first)", got)
	}
}

func TestRemove(t *testing.T) {
	w := func(id uint64, key string) Waiter {
		return Waiter{ID: id, Key: key, Cost: 10, Deadline: t0.Add(time.Minute)}
	}
	q := NewQueue(16, 0)
	push(t, q, w(1, "a"), w(2, "a"), w(3, "a"), w(4, "b"), w(5, "b"))
	if !q.Remove(1) || !q.Remove(2) {
		t.Fatal("Remove of queued waiters failed")
	}
	if q.Remove(2) || q.Remove(99) {
		t.Fatal("Remove of a waiter not queued succeeded")
	}
	if q.LenOf("a") != 1 || q.LenOf("b") != 2 || q.Len() != 3 {
		t.Fatalf("lengths a %d, b %d, all %d; want 1, 2, 3", q.LenOf("a"), q.LenOf("b"), q.Len())
	}
	// a's remaining waiter moved up by the two that left: it goes with b's first.
	if got := order(q); fmt.Sprint(got) != "[3 4 5]" {
		t.Fatalf("released %v, want [3 4 5]", got)
	}
}

func TestExpire(t *testing.T) {
	q := NewQueue(16, 0)
	for i, d := range []time.Duration{3, 1, 5, 2} {
		push(t, q, Waiter{ID: uint64(i + 1), Key: fmt.Sprint("k", i%2), Cost: 1, Deadline: t0.Add(d * time.Second)})
	}
	if d, ok := q.NextDeadline(); !ok || !d.Equal(t0.Add(time.Second)) {
		t.Fatalf("NextDeadline = %v, %v", d, ok)
	}
	var ids []uint64
	for _, w := range q.Expire(t0.Add(3 * time.Second)) {
		ids = append(ids, w.ID)
	}
	if fmt.Sprint(ids) != "[2 4 1]" {
		t.Fatalf("expired %v, want [2 4 1] (deadline order)", ids)
	}
	if got := order(q); fmt.Sprint(got) != "[3]" {
		t.Fatalf("left %v, want [3]", got)
	}
	if _, ok := q.NextDeadline(); ok {
		t.Fatal("NextDeadline of an empty queue")
	}
}

func TestExpireArrived(t *testing.T) {
	q := NewQueue(16, 0)
	at := func(id uint64, key string, ms int) Waiter {
		return Waiter{ID: id, Key: key, Cost: 10, Arrived: t0.Add(time.Duration(ms) * time.Millisecond), Deadline: t0.Add(time.Minute)}
	}
	// heavy is ahead of its share (three waiters); light has one.
	push(t, q, at(1, "heavy", 30), at(2, "heavy", 10), at(3, "light", 5), at(4, "heavy", 50))
	if o, ok := q.Oldest(); !ok || !o.Equal(t0.Add(5*time.Millisecond)) {
		t.Fatalf("Oldest = %v, %v", o, ok)
	}
	var ids []uint64
	for _, w := range q.ExpireArrived(t0.Add(30 * time.Millisecond)) {
		ids = append(ids, w.ID)
	}
	if fmt.Sprint(ids) != "[2 1]" || q.Len() != 2 {
		t.Fatalf("expired %v (left %d), want heavy's [2 1], oldest first; light spared", ids, q.Len())
	}
}

func TestKeysAndPeek(t *testing.T) {
	q := NewQueue(16, 0)
	push(t, q, Waiter{ID: 1, Key: "a", Cost: 1}, Waiter{ID: 2, Key: "b", Cost: 1, Priority: 1}, Waiter{ID: 3, Key: "a", Cost: 1})
	if got := fmt.Sprint(q.Keys()); got != "map[a:2 b:1]" {
		t.Fatalf("Keys = %s", got)
	}
	if w, ok := q.Peek(t0); !ok || w.ID != 2 {
		t.Fatalf("Peek = %+v, %v; want waiter 2", w, ok)
	}
	if w, _ := q.Pop(t0); w.ID != 2 {
		t.Fatalf("Pop after Peek = %d", w.ID)
	}
}

// FuzzQueue drives a queue with random operations and checks its
// invariants against a plain model: every waiter comes out once, bands in
// order, the size bound holds.
func FuzzQueue(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 0, 0, 255, 255, 7, 7, 3, 1, 200, 100})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 4096 {
			return
		}
		q := NewQueue(8, time.Second)
		queued := map[uint64]Waiter{}
		id := uint64(0)
		now := t0
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%5, ops[i+1]
			switch op {
			case 0, 1: // push
				id++
				w := Waiter{ID: id, Key: fmt.Sprint("k", arg%4), Priority: int(arg%3) - 1, Cost: float64(arg) * 7, Arrived: now, Deadline: now.Add(time.Duration(arg%16) * time.Second)}
				out, displaced, ok := q.Push(w)
				if ok {
					queued[w.ID] = w
				}
				if displaced {
					if _, was := queued[out.ID]; !was || out.Priority > w.Priority {
						t.Fatalf("displaced %+v for %+v", out, w)
					}
					for _, o := range queued {
						if o.Priority < out.Priority {
							t.Fatalf("displaced %+v while %+v of a lower band waits", out, o)
						}
					}
					delete(queued, out.ID)
				}
				if !ok && len(queued) < 8 {
					t.Fatalf("refused %+v with %d queued", w, len(queued))
				}
				if !ok && len(queued) == 8 {
					for _, o := range queued {
						if o.Priority <= w.Priority {
							t.Fatalf("refused %+v though %+v of a band not above waits", w, o)
						}
					}
				}
			case 2: // pop
				w, ok := q.Pop(now)
				if ok != (len(queued) > 0) {
					t.Fatalf("Pop ok %v with %d queued", ok, len(queued))
				}
				if ok {
					if _, was := queued[w.ID]; !was {
						t.Fatalf("popped %d, not queued", w.ID)
					}
					for _, o := range queued {
						if o.Priority > w.Priority {
							t.Fatalf("popped priority %d before %d", w.Priority, o.Priority)
						}
					}
					delete(queued, w.ID)
				}
			case 3: // remove
				target := uint64(arg) % (id + 1)
				_, was := queued[target]
				if q.Remove(target) != was {
					t.Fatalf("Remove(%d) disagrees with the model", target)
				}
				delete(queued, target)
			case 4: // time passes
				now = now.Add(time.Duration(arg%8) * time.Second)
				for _, w := range q.Expire(now) {
					if w.Deadline.After(now) {
						t.Fatalf("expired %+v before its deadline", w)
					}
					delete(queued, w.ID)
				}
				for _, w := range queued {
					if !w.Deadline.After(now) {
						t.Fatalf("kept %+v past its deadline", w)
					}
				}
			}
			if q.Len() != len(queued) || q.Len() > 8 {
				t.Fatalf("Len %d, model %d", q.Len(), len(queued))
			}
		}
		if got := len(order(q)); got != len(queued) {
			t.Fatalf("drained %d, model %d", got, len(queued))
		}
	})
}
