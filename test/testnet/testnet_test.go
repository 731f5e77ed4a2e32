package testnet

import "testing"

// TestFreePortNeverRepeats: within a process no port is handed out twice,
// alone or as part of a run, however many are drawn.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	mark := func(p, n int) {
		for j := 0; j < n; j++ {
			if seen[p+j] {
				t.Fatalf("port %d handed out twice", p+j)
			}
			seen[p+j] = true
		}
	}
	for i := 0; i < 1500; i++ {
		mark(FreePort(t), 1)
		if i%10 == 0 {
			mark(FreePortPair(t), 2)
			mark(FreePortRun(t, 4), 4)
		}
	}
}
