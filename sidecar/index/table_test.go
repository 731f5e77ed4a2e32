package index

import (
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// TestTableMatchesMap drives the table and a map with the same random
// adds and removes (hash 0 and repeated copies included).
func TestTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tb := newTable()
	ref := map[uint64]uint32{}
	keys := map[uint64]blockkey.Key{}
	for step := 0; step < 200000; step++ {
		h := rng.Uint64N(5000) // small range: many collisions and copies
		if rng.IntN(1000) == 0 {
			h = 0
		}
		if rng.IntN(2) == 0 {
			k := blockkey.Key(h * 7)
			isNew := tb.add(h, k)
			if isNew != (ref[h] == 0) {
				t.Fatalf("step %d: add(%d) new=%v, ref %d", step, h, isNew, ref[h])
			}
			ref[h]++
			keys[h] = k
		} else {
			k, ok, last := tb.remove(h)
			if ok != (ref[h] > 0) {
				t.Fatalf("step %d: remove(%d) ok=%v, ref %d", step, h, ok, ref[h])
			}
			if ok {
				if k != keys[h] {
					t.Fatal("wrong key")
				}
				ref[h]--
				if last != (ref[h] == 0) {
					t.Fatalf("last=%v with %d copies left", last, ref[h])
				}
				if ref[h] == 0 {
					delete(ref, h)
				}
			}
		}
		if step%997 == 0 {
			if tb.len() != len(ref) {
				t.Fatalf("len %d, want %d", tb.len(), len(ref))
			}
			for h, n := range ref {
				k, c, ok := tb.get(h)
				if !ok || c != n || k != keys[h] {
					t.Fatalf("get(%d) = %v %d %v, want %d copies", h, k, c, ok, n)
				}
			}
			seen := 0
			tb.each(func(h uint64, k blockkey.Key) {
				seen++
				if ref[h] == 0 {
					t.Fatalf("each yields absent %d", h)
				}
			})
			if seen != len(ref) {
				t.Fatalf("each saw %d of %d", seen, len(ref))
			}
		}
	}
	tb.reset()
	if tb.len() != 0 {
		t.Fatal("reset")
	}
}
