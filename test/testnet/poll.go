package testnet

import (
	"testing"
	"time"
)

// Await polls cond every interval until it returns nil, and fails t with
// cond's last error once timeout has passed: a bounded wait on a
// condition, never a fixed sleep.
func Await(t testing.TB, timeout, interval time.Duration, cond func() error) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("not within %v: %v", timeout, err)
		case <-tick.C:
		}
	}
}
