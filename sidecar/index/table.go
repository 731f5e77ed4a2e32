package index

import "github.com/kvroute/kvroute/internal/blockkey"

// table maps engine hashes to canonical keys in 16 bytes a slot: open
// addressing with linear probing, grown past 3/4 full and shrunk below
// 3/16, and
// backward-shift deletion (no tombstones). Copy counts above one — rare:
// the same content computed concurrently — live in a side map.
type table struct {
	slots []slot
	n     int
	zero  *blockkey.Key     // the entry for engine hash 0, which marks empty slots
	multi map[uint64]uint32 // copies beyond the first
}

type slot struct {
	h uint64 // engine hash; 0 = empty
	k blockkey.Key
}

const minSlots = 64

func newTable() *table { return &table{slots: make([]slot, minSlots), multi: map[uint64]uint32{}} }

func (t *table) len() int {
	if t.zero != nil {
		return t.n + 1
	}
	return t.n
}

func (t *table) home(h uint64) int {
	h ^= h >> 33 // engine hashes are digests already; fold the high half in
	h *= 0xff51afd7ed558ccd
	return int(h>>32) & (len(t.slots) - 1)
}

// get returns the canonical key and copy count of engine hash h.
func (t *table) get(h uint64) (blockkey.Key, uint32, bool) {
	if h == 0 {
		if t.zero == nil {
			return 0, 0, false
		}
		return *t.zero, 1 + t.multi[0], true
	}
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s.h == h {
			return s.k, 1 + t.multi[h], true
		}
		if s.h == 0 {
			return 0, 0, false
		}
	}
}

// add records one more copy of h (keyed k when new) and reports whether
// h is new.
func (t *table) add(h uint64, k blockkey.Key) bool {
	if _, _, ok := t.get(h); ok {
		t.multi[h]++
		return false
	}
	if h == 0 {
		t.zero = &k
		return true
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(len(t.slots) * 2)
	}
	t.insert(h, k)
	t.n++
	return true
}

func (t *table) insert(h uint64, k blockkey.Key) {
	mask := len(t.slots) - 1
	i := t.home(h)
	for t.slots[i].h != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = slot{h, k}
}

// remove drops one copy of h. It returns the key, whether h was present,
// and whether that was its last copy.
func (t *table) remove(h uint64) (blockkey.Key, bool, bool) {
	k, _, ok := t.get(h)
	if !ok {
		return 0, false, false
	}
	if c := t.multi[h]; c > 0 {
		if c == 1 {
			delete(t.multi, h)
		} else {
			t.multi[h] = c - 1
		}
		return k, true, false
	}
	if h == 0 {
		t.zero = nil
		return k, true, true
	}
	mask := len(t.slots) - 1
	i := t.home(h)
	for t.slots[i].h != h {
		i = (i + 1) & mask
	}
	// Backward-shift: pull later entries of the cluster into the hole.
	for j := (i + 1) & mask; t.slots[j].h != 0; j = (j + 1) & mask {
		home := t.home(t.slots[j].h)
		if (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
	if len(t.slots) > minSlots && t.n*8 < len(t.slots)*3/2 {
		t.resize(len(t.slots) / 2)
	}
	return k, true, true
}

func (t *table) resize(size int) {
	old := t.slots
	t.slots = make([]slot, size)
	for _, s := range old {
		if s.h != 0 {
			t.insert(s.h, s.k)
		}
	}
}

// each calls f for every entry.
func (t *table) each(f func(h uint64, k blockkey.Key)) {
	if t.zero != nil {
		f(0, *t.zero)
	}
	for _, s := range t.slots {
		if s.h != 0 {
			f(s.h, s.k)
		}
	}
}

func (t *table) reset() {
	t.slots = make([]slot, minSlots)
	t.n, t.zero = 0, nil
	clear(t.multi)
}
