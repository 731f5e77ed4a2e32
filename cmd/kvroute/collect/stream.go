package collect

import (
	"context"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/verify"
)

// streamSettle is how long verify gives sidecars, after its requests, to
// judge a stream they still call "unknown" (a sidecar reports a dead or
// one-sided stream within 5 s of its engine's first request).
const streamSettle = 5 * time.Second

// sidecarRank is one rank's entry of a sidecar's /debug/state, as far as
// verify reads it.
type sidecarRank struct {
	Identity struct {
		Endpoint string `json:"endpoint"`
		Rank     int    `json:"rank"`
	} `json:"identity"`
	// StreamState is nil from sidecars that do not report it.
	StreamState  *string `json:"stream_state"`
	StreamReason string  `json:"stream_reason"`
	EngineDown   bool    `json:"engine_down"`
	EngineError  string  `json:"engine_error"`
	// GossipInsecure: the sidecar gossips unencrypted off loopback.
	GossipInsecure bool `json:"gossip_insecure"`
}

// sidecarState reads a sidecar's /debug/state.
func (c *Collector) sidecarState(ctx context.Context, debugURL string) ([]sidecarRank, error) {
	var state []sidecarRank
	err := c.getJSON(ctx, debugURL+"/debug/state", &state)
	return state, err
}

// streams reads, for every endpoint of fleet, its sidecar's verdict on
// that rank's live event stream and on its engine; served are the
// endpoints whose engines answered verify's own requests. While a served
// endpoint's stream is still "unknown", it asks again, every 100 ms, for
// at most streamSettle.
func (c *Collector) streams(ctx context.Context, fleet []debugapi.Endpoint, served map[string]bool) []verify.StreamFacts {
	out := make([]verify.StreamFacts, len(fleet))
	start := time.Now()
	waiting := func(f verify.StreamFacts) bool { return f.Reported && f.State == verify.StreamUnknown && f.Served }
	for round := 0; ; round++ {
		states, errs := map[string][]sidecarRank{}, map[string]error{} // by debug URL, this round
		again := false
		for i, e := range fleet {
			if round > 0 && !waiting(out[i]) {
				continue
			}
			f := verify.StreamFacts{Endpoint: e.Endpoint, Rank: e.Rank, DebugURL: e.SidecarDebug, Served: served[e.Endpoint]}
			if f.DebugURL != "" {
				st, seen := states[f.DebugURL]
				if !seen && errs[f.DebugURL] == nil {
					var err error
					if st, err = c.sidecarState(ctx, f.DebugURL); err != nil {
						errs[f.DebugURL] = err
					}
					states[f.DebugURL] = st
				}
				if err := errs[f.DebugURL]; err != nil {
					f.Err = err.Error()
				}
				for _, r := range st {
					if r.Identity.Endpoint == e.Endpoint && r.Identity.Rank == e.Rank {
						f.Found, f.EngineDown, f.EngineError, f.Reason = true, r.EngineDown, r.EngineError, r.StreamReason
						if r.StreamState != nil {
							f.Reported, f.State = true, *r.StreamState
						}
					}
				}
			}
			f.WaitedSecs = time.Since(start).Seconds()
			out[i] = f
			again = again || waiting(f)
		}
		if !again || time.Since(start) >= streamSettle || !sleep(ctx, 100*time.Millisecond) {
			return out
		}
	}
}
