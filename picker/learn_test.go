package picker

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/predict"
)

// TestLearnerFactorsFollowTheRoster: the factors a snapshot gets are
// those of reporting every endpoint's counters and asking the model for
// every endpoint's factors at each decision (what the learner did before
// it kept them per roster), though it reports only the endpoints whose
// copy changed, across load reports carrying engine counters, first
// tokens learned, endpoints coming and going, and decisions over a part
// of the group.
func TestLearnerFactorsFollowTheRoster(t *testing.T) {
	cfg := fleet.DefaultConfig()
	cfg.Params = summary.ForCapacity(1024)
	s, err := fleet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ident := func(i int) fleet.Identity {
		return fleet.Identity{Endpoint: fmt.Sprintf("http://e%d:8000", i), Model: "m", BlockSize: 16, SummaryParams: cfg.Params.String()}
	}
	register := func(n int) {
		var ids []fleet.Identity
		for i := range n {
			ids = append(ids, ident(i))
		}
		if _, err := s.Register("s", ids, nil, time.Unix(0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	register(8)
	group := ident(0).Group()
	kept, ref := newLearner(predict.DefaultConfig()), newLearner(predict.DefaultConfig())
	rng := rand.New(rand.NewPCG(4, 4))
	stats := map[string]fleet.EngineStats{}
	now := time.Unix(1, 0)
	for step := range 400 {
		now = now.Add(10 * time.Millisecond)
		ro := s.Roster(group)
		switch rng.IntN(6) {
		case 0, 1: // a load report with the engine's counters grown
			e := ro.Endpoints[rng.IntN(len(ro.Endpoints))]
			st := stats[e.URL]
			n := float64(rng.IntN(3))
			st.Have, st.TTFTCount, st.TTFTSeconds = true, st.TTFTCount+n, st.TTFTSeconds+n*0.2
			st.PromptTokens, st.CachedTokens = st.PromptTokens+n*float64(500+rng.IntN(500)), st.CachedTokens+n*100
			stats[e.URL] = st
			s.ApplyLoad("s", e.URL, fleet.Load{Waiting: n, Engine: st}, now)
		case 2: // a first token learned, by both
			url := ro.Endpoints[rng.IntN(len(ro.Endpoints))].URL
			f := predict.Features{Tail: float64(rng.IntN(4000)), Ahead: float64(rng.IntN(2000))}
			ttft := time.Duration(50+rng.IntN(500)) * time.Millisecond
			kept.observe(group, url, f, ttft)
			ref.observe(group, url, f, ttft)
		case 3:
			if rng.IntN(8) == 0 {
				register(6 + rng.IntN(4)) // endpoints leave, or come back
			}
		}
		ro = s.Roster(group)
		snap := decide.Snapshot{Roster: ro}
		if rng.IntN(10) == 0 { // a part of the group (PickOptions.Only)
			snap.Roster = ro.Only(map[string]bool{ro.Endpoints[0].URL: true, ro.Endpoints[len(ro.Endpoints)-1].URL: true})
		}
		kept.into(&snap, group)
		whole := decide.Snapshot{Roster: fleet.NewRoster(snap.Roster.Endpoints)} // never kept: reported and asked whole
		ref.into(&whole, group)
		if !reflect.DeepEqual(snap.Factors, whole.Factors) {
			t.Fatalf("step %d: factors %v, reporting every endpoint %v", step, snap.Factors, whole.Factors)
		}
		if len(snap.Factors) != len(snap.Roster.Endpoints) {
			t.Fatalf("step %d: %d factors for %d endpoints", step, len(snap.Factors), len(snap.Roster.Endpoints))
		}
	}
	if st := kept.state()[group]; st.Observations == 0 || len(st.Endpoints) == 0 {
		t.Fatalf("nothing was learned: %+v", st)
	}
}
