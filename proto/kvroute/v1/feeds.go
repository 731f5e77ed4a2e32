package kvroutev1

import "fmt"

// MaxFeeds bounds the (endpoint, tier) pairs one stream may number: 1,024
// data-parallel ranks × 3 tiers, rounded up.
const MaxFeeds = 4096

// Feeds restores compact updates on one WatchSummaries stream (see
// SummaryUpdate.feed). The zero value is ready; use one per stream.
type Feeds struct {
	m map[uint32]feedRef
}

type feedRef struct {
	endpoint, tier string
	epoch          uint64
}

// Resolve fills in u's endpoint, tier and epoch when u carries only its
// feed number, and records the pair when u carries it in full. A number the
// stream never sent in full, or more than MaxFeeds numbers, is an error: the
// stream is corrupt and must be restarted.
func (f *Feeds) Resolve(u *SummaryUpdate) error {
	if u.GetFeed() == 0 {
		return nil
	}
	if u.GetEndpoint() != "" {
		if f.m == nil {
			f.m = map[uint32]feedRef{}
		}
		if _, ok := f.m[u.Feed]; !ok && len(f.m) >= MaxFeeds {
			return fmt.Errorf("more than %d feeds on one stream", MaxFeeds)
		}
		f.m[u.Feed] = feedRef{endpoint: u.Endpoint, tier: u.Tier, epoch: u.Epoch}
		return nil
	}
	r, ok := f.m[u.Feed]
	if !ok {
		return fmt.Errorf("update for feed %d, never announced on this stream", u.Feed)
	}
	u.Endpoint, u.Tier, u.Epoch = r.endpoint, r.tier, r.epoch
	return nil
}
