package fleetview

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
)

// TestProbeAllInParallel: a round of health probes runs them side by
// side, at most probeParallel at once, so engines that hang cost the round
// one probe timeout, not one each; every result is recorded (whether a
// probe the release reaches after its timeout passed is not asserted).
func TestProbeAllInParallel(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Params = summary.ForCapacity(1024)
	v, err := New(cfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	release, full := make(chan struct{}), make(chan struct{})
	var fullOnce sync.Once
	var inFlight, most atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		if n == probeParallel {
			fullOnce.Do(func() { close(full) })
		}
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	const engines = probeParallel + 4
	urls := make([]string, engines)
	for i := range urls {
		urls[i] = fmt.Sprintf("%s/e%d", srv.URL, i) // probed at <url>/health
	}
	var mu sync.Mutex
	recorded := map[string]bool{} // url → the probe succeeded
	done := make(chan struct{})
	go func() {
		v.probeAll(context.Background(), urls, func(url string, err error) {
			mu.Lock()
			recorded[url] = err == nil
			mu.Unlock()
		})
		close(done)
	}()
	select { // every slot busy at once: the probes run side by side
	case <-full:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d probes in flight at once, want %d", inFlight.Load(), probeParallel)
	}
	close(release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("probeAll did not return")
	}
	if m := most.Load(); m > probeParallel {
		t.Fatalf("%d probes at once, more than %d", m, probeParallel)
	}
	if len(recorded) != engines {
		t.Fatalf("%d results recorded of %d", len(recorded), engines)
	}
}
