package sidecar

import (
	"testing"

	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// TestHubCutsSlowWatchers: a watcher whose buffer is full is cut, the
// others keep receiving; the ring serves resumption only within its span.
func TestHubCutsSlowWatchers(t *testing.T) {
	cuts := 0
	h := newHub(func() { cuts++ })
	slow := &subscriber{ch: make(chan *pb.SummaryUpdate, 1), cut: make(chan struct{})}
	fast := &subscriber{ch: make(chan *pb.SummaryUpdate, 1000), cut: make(chan struct{})}
	h.subs[slow], h.subs[fast] = struct{}{}, struct{}{}
	h.snapshot(&pb.SummaryUpdate{Endpoint: "e", Tier: "GPU", Epoch: 1})
	for seq := uint64(1); seq <= ringSize+10; seq++ {
		h.delta(&pb.SummaryUpdate{Endpoint: "e", Tier: "GPU", Epoch: 1, Body: &pb.SummaryUpdate_Delta{Delta: &pb.Delta{Seq: seq}}})
	}
	select {
	case <-slow.cut:
	default:
		t.Fatal("slow watcher not cut")
	}
	if cuts != 1 || len(h.subs) != 1 || len(fast.ch) != ringSize+11 {
		t.Fatalf("cuts %d subs %d fast got %d", cuts, len(h.subs), len(fast.ch))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if ds, ok := h.sinceLocked("e", "GPU", 1, ringSize+5, ringSize+10); !ok || len(ds) != 5 {
		t.Fatalf("resume within the ring: %d %v", len(ds), ok)
	}
	if _, ok := h.sinceLocked("e", "GPU", 1, 3, ringSize+10); ok {
		t.Fatal("resumed from before the ring")
	}
	if _, ok := h.sinceLocked("e", "GPU", 2, ringSize+5, ringSize+10); ok {
		t.Fatal("resumed across epochs")
	}
	if ds, ok := h.sinceLocked("e", "GPU", 1, ringSize+10, ringSize+10); !ok || len(ds) != 0 {
		t.Fatal("an up-to-date watcher needs nothing")
	}
}
