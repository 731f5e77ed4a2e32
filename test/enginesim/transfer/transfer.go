package transfer

import (
	"time"

	"github.com/kvroute/kvroute/test/enginesim/profile"
)

// PullTimeout is how long a consumer waits for a fetch before it aborts
// it and recomputes: vLLM's _LOAD_TIMEOUT_S (kv-transfer.md §7).
const PullTimeout = 30 * time.Second

// Duration is the time a pull of tokens tokens takes when srcActive pulls
// are running on its source and dstActive on its destination (itself not
// counted), first when it is the pair's first: p.PullTime(tokens, 1 +
// max(srcActive, dstActive), first).
func Duration(p profile.Profile, tokens, srcActive, dstActive int, first bool) time.Duration {
	return p.PullTime(tokens, 1+max(srcActive, dstActive, 0), first)
}

// pull is one pull on the links.
type pull struct {
	src, dst   string
	start, end time.Duration
}

// pair is an unordered pair of nodes, the lesser name first.
type pair struct{ a, b string }

func pairOf(x, y string) pair {
	if y < x {
		x, y = y, x
	}
	return pair{x, y}
}

// Links are the pulls between named nodes. The zero value is ready: no
// pull has run.
type Links struct {
	pulls   []pull
	paired  map[pair]bool
	horizon time.Duration // the latest now given
}

// Start starts a pull of tokens tokens from src to dst at now and returns
// when it ends and whether it is the pair's first pull. A pull of no
// token moves nothing: it ends at now, is not recorded and warms nothing.
func (l *Links) Start(src, dst string, tokens int, now time.Duration, p profile.Profile) (end time.Duration, first bool) {
	if tokens <= 0 {
		return now, false
	}
	l.advance(now)
	k := pairOf(src, dst)
	first = !l.paired[k]
	if l.paired == nil {
		l.paired = map[pair]bool{}
	}
	l.paired[k] = true
	end = now + Duration(p, tokens, l.Active(src, now), l.Active(dst, now), first)
	l.pulls = append(l.pulls, pull{src: src, dst: dst, start: now, end: end})
	return end, first
}

// Active counts the pulls running on node at now, as source or as
// destination: started at or before now, ending after it.
func (l *Links) Active(node string, now time.Duration) int {
	n := 0
	for _, x := range l.pulls {
		if (x.src == node || x.dst == node) && x.start <= now && x.end > now {
			n++
		}
	}
	return n
}

// Warmed reports whether a and b have pulled from each other before.
func (l *Links) Warmed(a, b string) bool { return l.paired[pairOf(a, b)] }

// advance forgets the pulls that ended at or before now, if now is the
// latest time given.
func (l *Links) advance(now time.Duration) {
	if now <= l.horizon {
		return
	}
	l.horizon = now
	kept := l.pulls[:0]
	for _, x := range l.pulls {
		if x.end > now {
			kept = append(kept, x)
		}
	}
	clear(l.pulls[len(kept):])
	l.pulls = kept
}
