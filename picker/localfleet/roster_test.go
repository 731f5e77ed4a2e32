package localfleet_test

import (
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/localfleet"
)

// TestRosterIsGroupEndpoints: the fleet's roster holds what
// GroupEndpoints copies out, in sync (every endpoint stamped heard at
// Clock()) or not, each brief its endpoint's, and a stamped roster leaves
// the state's own untouched.
func TestRosterIsGroupEndpoints(t *testing.T) {
	for _, inSync := range []bool{true, false} {
		c := &clock{now: t0}
		f := newFleet(t, c, func(cfg *localfleet.Config) { cfg.InSync = inSync })
		add(t, f, t0, ident("http://b:8000", model, bs), ident("http://a:8000", model, bs))
		g := groupOf(t, f, "http://a:8000")
		c.add(5 * time.Second) // past --stale-summary: only a stamp keeps them fresh
		f.SetLoad("http://b:8000", fleet.Load{Waiting: 3}, c.Now())
		c.add(time.Second)
		r := f.Roster(g)
		var got []fleet.Endpoint
		for i, e := range r.Endpoints {
			got = append(got, *e)
			if r.Briefs[i] != e.Brief() {
				t.Errorf("in sync %v: brief %+v of %+v", inSync, r.Briefs[i], *e)
			}
		}
		if want := f.GroupEndpoints(g); !reflect.DeepEqual(got, want) {
			t.Errorf("in sync %v: roster %+v, GroupEndpoints %+v", inSync, got, want)
		}
		want := fleet.Cached
		if !inSync {
			want = fleet.LoadOnly // a's last word is 6 s old
		}
		if st := r.Briefs[0].StateAt(c.Now(), fleet.DefaultHealthConfig()); st != want {
			t.Errorf("in sync %v: a is %v, want %v", inSync, st, want)
		}
		if inSync {
			if e := f.Roster(g).Endpoints[0]; e == r.Endpoints[0] {
				t.Error("in sync, the stamped endpoint is shared between reads")
			}
		}
	}
}

// TestRosterReadsWhileUpdated: rosters read by many goroutines while
// loads, failures and endpoints change (run with -race).
func TestRosterReadsWhileUpdated(t *testing.T) {
	f := newFleet(t, nil, func(cfg *localfleet.Config) { cfg.InSync = false })
	now := time.Now()
	add(t, f, now, ident("http://a:8000", model, bs), ident("http://b:8000", model, bs))
	g := groupOf(t, f, "http://a:8000")
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 500 {
				r := f.Roster(g)
				for i, e := range r.Endpoints {
					_ = r.Briefs[i].StateAt(time.Now(), fleet.DefaultHealthConfig())
					_ = e.Load.Waiting
				}
			}
		})
	}
	for i := range 500 {
		f.SetLoad("http://b:8000", fleet.Load{Running: float64(i)}, time.Now())
		if i%50 == 0 {
			f.ReportFailure("http://a:8000", "refused")
			f.Probe(time.Now().Add(time.Minute), func(string) bool { return true })
		}
		if i%100 == 0 {
			f.Remove("http://c:8000")
			add(t, f, time.Now(), ident("http://c:8000", model, bs))
		}
	}
	wg.Wait()
}
