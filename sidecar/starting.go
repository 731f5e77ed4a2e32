package sidecar

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/kvroute/kvroute/sidecar/streamhealth"
)

// boot is what the admin listener shows while Start waits for the
// engines (a real vLLM takes minutes to load its model): each rank's
// engine URL, whether it answered, and the last error asking it gave. It
// has a lock of its own; the starting surface reads nothing else of the
// sidecar but the registry, so no request sees a half-built sidecar.
type boot struct {
	mu    sync.Mutex
	ranks []bootRank
}

// bootRank is one rank's entry in the starting surface's answers.
type bootRank struct {
	Rank      int    `json:"rank"`
	Engine    string `json:"engine"`
	Answered  bool   `json:"answered"`
	LastError string `json:"last_error,omitempty"`
}

// newBoot lists every rank's engine URL, none answered yet.
func newBoot(cfg *Config) (*boot, error) {
	b := &boot{}
	for r := 0; r < cfg.DataParallelSize; r++ {
		u, err := offsetURL(cfg.EngineURL, r)
		if err != nil {
			return nil, err
		}
		b.ranks = append(b.ranks, bootRank{Rank: r, Engine: u})
	}
	return b, nil
}

// waiting records the error rank's last identification attempt gave.
func (b *boot) waiting(rank int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ranks[rank].LastError = err.Error()
}

// answered records that rank's engine answered its identification.
func (b *boot) answered(rank int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ranks[rank].Answered, b.ranks[rank].LastError = true, ""
}

// snapshot copies the ranks' entries.
func (b *boot) snapshot() []bootRank {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]bootRank(nil), b.ranks...)
}

// handleReady is /readyz while starting: 503, in the ready handler's
// failure shape, with a problem per rank naming its engine and what it
// waits for.
func (b *boot) handleReady(w http.ResponseWriter, r *http.Request) {
	var problems []string
	streams := map[string]string{}
	for _, rk := range b.snapshot() {
		streams[strconv.Itoa(rk.Rank)] = streamhealth.Unknown.String()
		switch {
		case rk.Answered:
			problems = append(problems, fmt.Sprintf("rank %d: the engine at %s answered; opening the kv event intake", rk.Rank, rk.Engine))
		case rk.LastError == "":
			problems = append(problems, fmt.Sprintf("rank %d: waiting for the engine at %s: no answer yet", rk.Rank, rk.Engine))
		default:
			problems = append(problems, fmt.Sprintf("rank %d: waiting for the engine at %s: %s", rk.Rank, rk.Engine, rk.LastError))
		}
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "problems": problems, "streams": streams})
}

// unavailable answers the admin paths that need a started sidecar
// (/debug/state, /debug/keys, …) while it starts: 503, saying so and
// what it waits for.
func (b *boot) unavailable(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{"starting": true,
		"error":   "the sidecar is starting: waiting for its engines to answer",
		"engines": b.snapshot()})
}

// adminRoute is one path of the admin surface: its handler once the
// sidecar started, and while it starts (nil: boot.unavailable).
type adminRoute struct {
	pattern  string
	serve    http.Handler
	starting http.Handler
}

// startingHandler is the admin surface while Start waits for the engines:
// the same paths (others 404, wrong methods 405), /healthz and /metrics
// as ever, /readyz failing with what is awaited, the rest 503.
func (s *Sidecar) startingHandler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		h := rt.starting
		if h == nil {
			h = http.HandlerFunc(s.boot.unavailable)
		}
		mux.Handle(rt.pattern, h)
	}
	return mux
}
