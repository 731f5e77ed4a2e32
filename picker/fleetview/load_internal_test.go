package fleetview

import (
	"testing"

	"github.com/kvroute/kvroute/picker/fleet"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// TestLoadOf: a load report becomes kvroute's fleet.Load field by field,
// the engine's request figures included; a report without them (an older
// sidecar), or one whose engine exports none (have false), has none.
func TestLoadOf(t *testing.T) {
	l := &pb.LoadReport{Waiting: 3, Running: 5, KvCacheUsage: 0.25, EngineDown: true, EngineError: "refused",
		StreamState: "live", StreamReason: "ok", Draining: true, DrainReason: "SIGTERM",
		Engine: &pb.EngineStats{Have: true, QueueSeconds: 1.5, QueueCount: 2, PrefillSeconds: 2.5, PrefillCount: 3,
			TtftSeconds: 4.5, TtftCount: 4, PromptTokens: 1000, CachedTokens: 600}}
	want := fleet.Load{Waiting: 3, Running: 5, KVCacheUsage: 0.25, EngineDown: true, EngineError: "refused",
		StreamState: "live", StreamReason: "ok", Draining: true, DrainReason: "SIGTERM",
		Engine: fleet.EngineStats{Have: true, QueueSeconds: 1.5, QueueCount: 2, PrefillSeconds: 2.5, PrefillCount: 3,
			TTFTSeconds: 4.5, TTFTCount: 4, PromptTokens: 1000, CachedTokens: 600}}
	if got := loadOf(l); got != want {
		t.Fatalf("loadOf:\n got %+v\nwant %+v", got, want)
	}
	l.Engine = nil
	want.Engine = fleet.EngineStats{}
	if got := loadOf(l); got != want {
		t.Fatalf("without engine figures: %+v", got)
	}
	l.Engine = &pb.EngineStats{PromptTokens: 7}
	if got := loadOf(l); got != want {
		t.Fatalf("with have false: %+v", got)
	}
}
