package streamhealth

import (
	"math"
	"strings"
	"testing"
	"time"
)

func nan() float64 { return math.NaN() }
func inf() float64 { return math.Inf(1) }

// FuzzJudge drives a Judge with arbitrary observations (each op a kind
// byte, a time step and counter moves) and checks the invariants after
// every one: a named state with a reason; partial exactly while the flag
// is set; live and replay_only only after a batch of that kind; silent and
// replay_only only after the counters grew; live right after a live batch
// (unless partial); never unknown again once judged; Since never in the
// future and zero only for the initial unknown.
func FuzzJudge(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 0, 0, 10, 200, 0, 0, 5, 255, 5, 255})
	f.Add([]byte{0, 1, 0, 0, 0, 1, 2, 0, 5, 200, 5, 200})
	f.Add([]byte{0, 1, 0, 0, 0, 0, 10, 200, 1, 0, 3, 0, 5, 255, 4, 0})
	f.Add([]byte{0, 1, 0, 0, 0, 0, 10, 50, 0, 0, 2, 100, 0, 10, 200, 0, 0, 5, 255, 6, 0, 5, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		cfg := DefaultConfig()
		if len(ops) > 0 && ops[0]&1 == 1 {
			cfg.Bind = true
		}
		j, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		now := t0
		var cnt Counters
		cnt.HaveQueries, cnt.HaveRequests, cnt.BlockSize = true, true, 16
		var everLive, everReplay, everGrew, partial, judged bool
		lastComputed := math.NaN()
		next := func(i *int) byte {
			if *i >= len(ops) {
				return 0
			}
			b := ops[*i]
			*i++
			return b
		}
		for i := 0; i < len(ops); {
			kind := next(&i) % 7
			now = now.Add(time.Duration(next(&i)) * 20 * time.Millisecond)
			live := false
			switch kind {
			case 0: // a scrape: queries up by b blocks, hits by h tokens, r requests finished
				b, h, r := next(&i), next(&i), next(&i)
				cnt.PrefixQueries += float64(b) * 16
				cnt.PrefixHits = min(cnt.PrefixQueries, cnt.PrefixHits+float64(h))
				cnt.Requests += float64(r % 4)
				cnt.InFlight = float64(r / 64)
				if computed := cnt.PrefixQueries - cnt.PrefixHits; computed > lastComputed {
					everGrew = true
				}
				lastComputed = cnt.PrefixQueries - cnt.PrefixHits
				j.Scraped(now, cnt)
			case 1:
				j.LiveBatch(now)
				everLive, live = true, true
			case 2:
				j.ReplayedBatch(now)
				everReplay = true
			case 3:
				partial = true
				j.SetPartial(now, true, "lost")
			case 4:
				partial = false
				j.SetPartial(now, false, "")
			case 5: // a restart: the counters start over
				cnt.PrefixQueries, cnt.PrefixHits, cnt.Requests = 0, 0, 0
				j.Scraped(now, cnt)
				lastComputed = 0
			case 6: // an unusable scrape
				bad := cnt
				bad.BlockSize = 0
				if next(&i)&1 == 1 {
					bad.PrefixQueries = math.NaN()
				}
				j.Scraped(now, bad)
				lastComputed = math.NaN()
			}
			st := j.Judge(now)
			if strings.HasPrefix(st.State.String(), "state(") || st.Reason == "" {
				t.Fatalf("state %v, reason %q", st.State, st.Reason)
			}
			if (st.State == Partial) != partial {
				t.Fatalf("state %v with the partial flag %v", st.State, partial)
			}
			if st.State == Live && !everLive || st.State == ReplayOnly && !everReplay {
				t.Fatalf("%v without such a batch", st.State)
			}
			if (st.State == Silent || st.State == ReplayOnly) && !everGrew {
				t.Fatalf("%v without the counters growing", st.State)
			}
			if live && !partial && st.State != Live {
				t.Fatalf("%v right after a live batch", st.State)
			}
			if st.State == Unknown && judged {
				t.Fatal("unknown again")
			}
			if st.State != Unknown && st.State != Partial {
				judged = true
			}
			if st.Since.After(now) || st.Since.IsZero() != (st.State == Unknown) {
				t.Fatalf("%v since %v at %v", st.State, st.Since, now)
			}
		}
	})
}
