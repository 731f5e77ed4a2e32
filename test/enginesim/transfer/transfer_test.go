package transfer_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
)

func glm(t *testing.T) profile.Profile {
	t.Helper()
	p, err := profile.Named(profile.GLM52Rank)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestStart: a sequence of pulls on one set of links, each with the share
// and the connection cost it must pay, worked by hand from glm52-rank's
// constants (1.25 s setup, 6 s first pull, 4.5 GB/s, 93,000 B/token:
// 45,000 tokens move in 0.93 s alone).
func TestStart(t *testing.T) {
	p := glm(t)
	const n = 45_000
	bytes := func(share int) time.Duration { return time.Duration(share) * 930 * time.Millisecond }
	s := time.Second
	var links transfer.Links
	for _, c := range []struct {
		name     string
		src, dst string
		tokens   int
		at       time.Duration
		first    bool
		duration time.Duration
		activeA  int // pulls on a just after the start
	}{
		{"a's first pull from b pays the connection", "b", "a", n, 0, true, 7250*time.Millisecond + bytes(1), 1},
		{"c to d, elsewhere, alone", "c", "d", n, 0, true, 7250*time.Millisecond + bytes(1), 1},
		{"b to a again while the first runs: shares with it, pair warmed (either direction)", "a", "b", n, s, false, 1250*time.Millisecond + bytes(2), 2},
		{"a to c: a has two running, c one: share 3", "a", "c", n, 2 * s, true, 7250*time.Millisecond + bytes(3), 3},
		{"nothing to pull: ends at once, warms nothing, not counted", "e", "a", 0, 3 * s, false, 0, 3},
		{"after all ended: alone again", "b", "a", n, 20 * s, false, 1250*time.Millisecond + bytes(1), 1},
		{"e to a, the pair never pulled (the empty one did not count)", "e", "a", n, 20 * s, true, 7250*time.Millisecond + bytes(2), 2},
	} {
		end, first := links.Start(c.src, c.dst, c.tokens, c.at, p)
		if end != c.at+c.duration || first != c.first {
			t.Errorf("%s: ends %v (first %v), want %v (first %v)", c.name, end, first, c.at+c.duration, c.first)
		}
		if got := links.Active("a", c.at); got != c.activeA {
			t.Errorf("%s: %d pulls active on a, want %d", c.name, got, c.activeA)
		}
	}
}

// TestActive: a pull counts on both its ends from its start until its
// end (exclusive), and on no other node.
func TestActive(t *testing.T) {
	p := glm(t)
	var links transfer.Links
	end, _ := links.Start("src", "dst", 1000, 10*time.Second, p)
	for _, c := range []struct {
		node string
		at   time.Duration
		want int
	}{
		{"src", 10 * time.Second, 1},
		{"dst", 10 * time.Second, 1},
		{"other", 10 * time.Second, 0},
		{"src", 10*time.Second - 1, 0}, // not started yet
		{"dst", end - 1, 1},
		{"dst", end, 0}, // ended
	} {
		if got := links.Active(c.node, c.at); got != c.want {
			t.Errorf("%s at %v: %d active, want %d", c.node, c.at, got, c.want)
		}
	}
	if !links.Warmed("dst", "src") || links.Warmed("src", "other") {
		t.Error("warmed pairs wrong")
	}
}

// TestDuration: the pure function gives what Start charges, from the
// counts each end reports; the share is the busier end's, plus one.
func TestDuration(t *testing.T) {
	p := glm(t)
	for _, c := range []struct {
		tokens, src, dst int
		first            bool
		want             time.Duration
	}{
		{45_000, 0, 0, false, 2180 * time.Millisecond},
		{45_000, 2, 0, false, 1250*time.Millisecond + 3*930*time.Millisecond},
		{45_000, 1, 3, true, 7250*time.Millisecond + 4*930*time.Millisecond},
		{45_000, -1, 0, false, 2180 * time.Millisecond}, // a bad count is no pull
		{0, 5, 5, true, 0},
	} {
		if got := transfer.Duration(p, c.tokens, c.src, c.dst, c.first); got != c.want {
			t.Errorf("%d tokens, %d on the source, %d on the destination, first %v: %v, want %v", c.tokens, c.src, c.dst, c.first, got, c.want)
		}
	}
	// Start agrees with Duration on the counts it saw.
	var links transfer.Links
	links.Start("a", "b", 9000, 0, p)
	links.Start("c", "b", 9000, 0, p)
	srcActive, dstActive := links.Active("d", time.Second), links.Active("b", time.Second)
	end, first := links.Start("d", "b", 45_000, time.Second, p)
	if want := time.Second + transfer.Duration(p, 45_000, srcActive, dstActive, true); end != want || !first {
		t.Errorf("Start: %v (first %v), Duration: %v", end, first, want)
	}
	if transfer.PullTimeout != 30*time.Second {
		t.Errorf("PullTimeout %v, vLLM's _LOAD_TIMEOUT_S is 30 s", transfer.PullTimeout)
	}
}
