package sidecar

import (
	"sync"

	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// ringSize is how many recent deltas each endpoint-tier keeps for callers
// resuming from a known position.
const ringSize = 256

// subBuffer is how many updates a watcher may fall behind before it is cut.
const subBuffer = 4096

// feed is one endpoint-tier's recent deltas.
type feed struct {
	epoch  uint64
	deltas []*pb.SummaryUpdate // ascending seq, at most ringSize
}

// subscriber is one WatchSummaries call.
type subscriber struct {
	ch      chan *pb.SummaryUpdate
	cut     chan struct{}
	cutOnce sync.Once
}

// hub fans deltas, snapshots and load reports out to watchers. Lock order:
// an endpoint's mu before the hub's.
type hub struct {
	mu    sync.Mutex
	feeds map[string]*feed // "<endpoint>|<tier>"
	subs  map[*subscriber]struct{}
	cuts  func() // counts a cut watcher
}

func newHub(onCut func()) *hub {
	return &hub{feeds: map[string]*feed{}, subs: map[*subscriber]struct{}{}, cuts: onCut}
}

// watchers counts the pickers watching.
func (h *hub) watchers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

func feedKey(endpoint, tier string) string { return endpoint + "|" + tier }

// broadcast hands u to every watcher; one that cannot keep up is cut.
// Callers hold h.mu.
func (h *hub) broadcast(u *pb.SummaryUpdate) {
	for s := range h.subs {
		select {
		case s.ch <- u:
		default:
			h.cutLocked(s)
		}
	}
}

func (h *hub) cutLocked(s *subscriber) {
	delete(h.subs, s)
	s.cutOnce.Do(func() { close(s.cut) })
	if h.cuts != nil {
		h.cuts()
	}
}

// snapshot starts a feed afresh (new tier, new epoch) and sends the
// snapshot to every watcher.
func (h *hub) snapshot(u *pb.SummaryUpdate) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.feeds[feedKey(u.Endpoint, u.Tier)] = &feed{epoch: u.Epoch}
	h.broadcast(u)
}

// hasFeed reports whether endpoint-tier has a feed in the given epoch.
func (h *hub) hasFeed(endpoint, tier string, epoch uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := h.feeds[feedKey(endpoint, tier)]
	return f != nil && f.epoch == epoch
}

// delta records and sends a delta.
func (h *hub) delta(u *pb.SummaryUpdate) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := h.feeds[feedKey(u.Endpoint, u.Tier)]
	if f == nil || f.epoch != u.Epoch {
		f = &feed{epoch: u.Epoch}
		h.feeds[feedKey(u.Endpoint, u.Tier)] = f
	}
	if len(f.deltas) == ringSize {
		copy(f.deltas, f.deltas[1:])
		f.deltas = f.deltas[:ringSize-1]
	}
	f.deltas = append(f.deltas, u)
	h.broadcast(u)
}

// load sends a load report.
func (h *hub) load(u *pb.SummaryUpdate) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.broadcast(u)
}

// since returns the ring's deltas after seq in epoch, or ok=false when the
// ring cannot continue from there. Callers hold h.mu.
func (h *hub) sinceLocked(endpoint, tier string, epoch, seq, current uint64) ([]*pb.SummaryUpdate, bool) {
	if seq == current {
		return nil, true
	}
	f := h.feeds[feedKey(endpoint, tier)]
	if f == nil || f.epoch != epoch || len(f.deltas) == 0 || seq > current {
		return nil, false
	}
	first := f.deltas[0].GetDelta().GetSeq()
	if seq+1 < first {
		return nil, false
	}
	var out []*pb.SummaryUpdate
	for _, d := range f.deltas {
		if d.GetDelta().GetSeq() > seq {
			out = append(out, d)
		}
	}
	return out, true
}

func (h *hub) remove(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
}
