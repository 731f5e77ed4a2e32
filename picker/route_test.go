package picker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/intake"
)

// TestRouteSteps: the route's steps, called one at a time, are what Route
// does: Decide books nothing and decides the same twice over one
// snapshot; Book makes the pick count in flight in the next snapshot, and
// Done ends it; Route decides as the steps do.
func TestRouteSteps(t *testing.T) {
	f := startFleet(t, 2, picker.DefaultConfig(), "")
	r := f.router
	prompt := make([]uint32, 256)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	b, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "token_ids": prompt, "cache_salt": "steps"})
	ctx := context.Background()
	opt := picker.PickOptions{Carried: true}

	p, err := r.Prepare(ctx, intake.Any, b)
	if err != nil {
		t.Fatal(err)
	}
	leave, err := r.Admit(ctx, p, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	now := time.Now()
	snap := r.Snapshot(p, opt, now)
	if len(snap.Group()) != 2 || len(snap.InFlight) != 0 {
		t.Fatalf("snapshot before any pick: %d endpoints, in flight %v", len(snap.Group()), snap.InFlight)
	}
	first, err := r.Decide(p, snap, opt, now)
	if err != nil {
		t.Fatal(err)
	}
	again, err := r.Decide(p, snap, opt, now)
	if err != nil || again.Endpoint != first.Endpoint || again.Reason != first.Reason {
		t.Fatalf("the same snapshot decided twice: %s (%s), then %s (%s) %v", first.Endpoint, first.Reason, again.Endpoint, again.Reason, err)
	}
	if s := r.Snapshot(p, opt, now); len(s.InFlight) != 0 {
		t.Fatalf("Decide booked: in flight %v", s.InFlight)
	}
	r.Book(first, opt, now)
	s := r.Snapshot(p, opt, now)
	if got := s.InFlight[first.Endpoint]; got.Count != 1 || got.Tokens != float64(len(prompt)) {
		t.Fatalf("after Book, %s has %+v in flight, want 1 pick of %d tokens", first.Endpoint, got, len(prompt))
	}
	r.Done(first)
	if s := r.Snapshot(p, opt, now); len(s.InFlight) != 0 {
		t.Fatalf("after Done: in flight %v", s.InFlight)
	}

	routed, err := r.Route(ctx, intake.Any, b, picker.PickOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Done(routed)
	if routed.Endpoint != first.Endpoint || routed.Reason != first.Reason || routed.PrefixHash != first.PrefixHash {
		t.Fatalf("Route chose %s (%s, %s), the steps %s (%s, %s)", routed.Endpoint, routed.Reason, routed.PrefixHash, first.Endpoint, first.Reason, first.PrefixHash)
	}
}
