package summary

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// Fleet is the picker's index of every endpoint's summary in one identity
// group and tier, bit-sliced: for each of the m bit positions a row holding
// one bit per endpoint slot. A key's endpoints are the AND of its k rows,
// so one pass over a request's key chain yields every endpoint's matched
// length. It holds m × slots bits: 2 bytes per (endpoint, block) at the
// 16 bits a block the parameters are sized for.
//
// Endpoints are slots 0..Slots()-1 assigned by the caller; a slot's bits
// are replaced wholesale by SetSnapshot and flipped by ApplyDelta. Fleet
// does no I/O and is not safe for concurrent use: the picker guards it (or
// swaps immutable copies).
type Fleet struct {
	p     Params
	words int      // words per row: ⌈slots/64⌉
	rows  []uint64 // row pos at rows[pos*words : (pos+1)*words]
	slots []slotState
}

type slotState struct {
	used  bool   // holds a complete summary
	dirty bool   // its rows may have bits set (used, or a load begun)
	gen   uint64 // bumped by every replacement or removal
	epoch uint64
	seq   uint64
}

// NewFleet returns an empty index for up to slots endpoints.
func NewFleet(p Params, slots int) (*Fleet, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if slots < 1 || slots > 1<<16 {
		return nil, fmt.Errorf("summary: %d endpoint slots: want 1..65536", slots)
	}
	w := (slots + 63) / 64
	return &Fleet{p: p, words: w, rows: make([]uint64, int(p.M)*w), slots: make([]slotState, w*64)}, nil
}

// Params returns the fleet's parameters.
func (f *Fleet) Params() Params { return f.p }

// Slots returns the number of endpoint slots.
func (f *Fleet) Slots() int { return len(f.slots) }

// Position returns a slot's (epoch, seq) and whether it holds a summary.
func (f *Fleet) Position(slot int) (epoch, seq uint64, ok bool) {
	if slot < 0 || slot >= len(f.slots) {
		return 0, 0, false
	}
	s := f.slots[slot]
	return s.epoch, s.seq, s.used
}

// SetSnapshot replaces slot's summary with snap (of epoch).
func (f *Fleet) SetSnapshot(slot int, epoch uint64, snap Snapshot) error {
	l, err := f.LoadSnapshot(slot, epoch, snap)
	if err != nil {
		return err
	}
	_, err = l.Step(len(snap.Words))
	return err
}

// ErrAbandoned reports a snapshot load overtaken by another change to its
// slot.
var ErrAbandoned = errors.New("summary: snapshot load abandoned: the slot changed meanwhile")

// SnapshotLoad writes a snapshot into a slot a part at a time.
type SnapshotLoad struct {
	f     *Fleet
	slot  int
	gen   uint64
	epoch uint64
	snap  Snapshot
	next  int  // the next word of snap.Words to write
	clean bool // the slot's rows were all clear: only set bits need writing
	// In a LoadBatch: batched, and the words left to write in its lap.
	batched bool
	left    int
}

// LoadSnapshot starts replacing slot's summary with snap (of epoch), for a
// caller that guards the fleet with a lock and should not hold it through
// the whole rewrite (m rows: milliseconds at m = 2^20, a fifth of a second
// at 2^24): it may release the lock between Steps. Until the last Step the
// slot reads as absent — no position, matched length 0 — so a lookup never
// sees half a summary. Any other change to the slot meanwhile (Remove,
// SetSnapshot, another load) abandons this one.
func (f *Fleet) LoadSnapshot(slot int, epoch uint64, snap Snapshot) (*SnapshotLoad, error) {
	if slot < 0 || slot >= len(f.slots) {
		return nil, fmt.Errorf("summary: slot %d of %d", slot, len(f.slots))
	}
	if err := f.p.Compatible(snap.Params); err != nil {
		return nil, err
	}
	if len(snap.Words) != int(f.p.M/64) {
		return nil, errCorrupt("snapshot of %d words, want %d", len(snap.Words), f.p.M/64)
	}
	gen, clean := f.slots[slot].gen+1, !f.slots[slot].dirty
	f.slots[slot] = slotState{dirty: true, gen: gen}
	return &SnapshotLoad{f: f, slot: slot, gen: gen, epoch: epoch, snap: snap, clean: clean}, nil
}

// Step writes the slot's rows for up to words more snapshot words (64 rows
// a word) and reports whether the load is complete; the slot is then in
// use at the snapshot's position. It returns ErrAbandoned when the slot
// changed since LoadSnapshot.
func (l *SnapshotLoad) Step(words int) (done bool, err error) {
	f := l.f
	if f.slots[l.slot].gen != l.gen {
		return false, ErrAbandoned
	}
	end := min(l.next+max(words, 1), len(l.snap.Words))
	for i := l.next; i < end; i++ {
		l.writeWord(i)
	}
	l.next = end
	if end < len(l.snap.Words) {
		return false, nil
	}
	s := &f.slots[l.slot]
	s.used, s.epoch, s.seq = true, l.epoch, l.snap.Seq
	return true, nil
}

// ApplyDelta flips slot's bits. The delta must be the next in the slot's
// epoch; a SeqError says the caller needs a snapshot.
func (f *Fleet) ApplyDelta(slot int, epoch uint64, d Delta) error {
	if slot < 0 || slot >= len(f.slots) {
		return fmt.Errorf("summary: slot %d of %d", slot, len(f.slots))
	}
	s := &f.slots[slot]
	if !s.used || s.epoch != epoch || d.Seq != s.seq+1 {
		return &SeqError{Have: s.seq, Got: d.Seq}
	}
	for _, pos := range d.Flips {
		if pos >= f.p.M {
			return errCorrupt("flip position %d beyond m = %d", pos, f.p.M)
		}
	}
	w, bit := slot/64, uint64(1)<<(slot%64)
	for _, pos := range d.Flips {
		f.rows[int(pos)*f.words+w] ^= bit
	}
	s.seq = d.Seq
	return nil
}

// Remove forgets slot (its endpoint died or left).
func (f *Fleet) Remove(slot int) {
	if slot < 0 || slot >= len(f.slots) {
		return
	}
	f.clearSlot(slot)
	f.slots[slot] = slotState{gen: f.slots[slot].gen + 1}
}

func (f *Fleet) clearSlot(slot int) {
	if !f.slots[slot].dirty {
		return
	}
	w, mask := slot/64, ^(uint64(1) << (slot % 64))
	for pos := w; pos < len(f.rows); pos += f.words {
		f.rows[pos] &= mask
	}
}

// MatchLinear writes into matched[s] the number of leading keys of chain
// that slot s may hold (every probe bit set for every key up to there), for
// every slot, in one pass: the walk stops when no slot is left. matched
// must have Slots() entries. It returns the longest match.
func (f *Fleet) MatchLinear(chain []blockkey.Key, matched []int) int {
	clear(matched)
	if len(chain) == 0 {
		return 0
	}
	var stack [4]uint64
	var alive []uint64
	if f.words <= len(stack) {
		alive = stack[:f.words]
	} else {
		alive = make([]uint64, f.words)
	}
	for i := range alive {
		alive[i] = ^uint64(0)
	}
	var probes [MaxK]uint32
	depth := 0
	for ; depth < len(chain); depth++ {
		next := alive
		any := uint64(0)
		if f.words == 1 {
			a := alive[0]
			for _, pos := range f.p.Probes(chain[depth], &probes) {
				a &= f.rows[pos]
			}
			f.dropped(0, alive[0]&^a, depth, matched)
			alive[0] = a
			any = a
		} else {
			for w := range alive {
				a := alive[w]
				for _, pos := range f.p.Probes(chain[depth], &probes) {
					a &= f.rows[int(pos)*f.words+w]
					if a == 0 {
						break
					}
				}
				f.dropped(w, alive[w]&^a, depth, matched)
				next[w] = a
				any |= a
			}
		}
		if any == 0 {
			return f.longest(matched)
		}
	}
	for w, a := range alive {
		f.dropped(w, a, depth, matched)
	}
	return f.longest(matched)
}

// dropped records depth as the matched length of the slots in gone.
func (f *Fleet) dropped(w int, gone uint64, depth int, matched []int) {
	for gone != 0 {
		s := w*64 + bits.TrailingZeros64(gone)
		if s < len(matched) {
			matched[s] = depth
		}
		gone &= gone - 1
	}
}

func (f *Fleet) longest(matched []int) int {
	best := 0
	for s, n := range matched {
		if !f.slots[s].used {
			matched[s] = 0
			continue
		}
		best = max(best, n)
	}
	return best
}

// andWord ANDs into a, the slots of row word w, the k probe rows of key:
// the slots of that word that may hold key. The positions are computed
// as it goes (Params.Probes' function, without its buffer), and it stops
// early once a is empty.
func (f *Fleet) andWord(key blockkey.Key, w int, a uint64) uint64 {
	h := splitmix(uint64(key))
	base := int(((h>>32)*uint64(f.p.M/BlockBits))>>32) * BlockBits
	rows := f.rows[base*f.words : (base+BlockBits)*f.words]
	for k, round := int(f.p.K), uint64(1); k > 0 && a != 0; round++ {
		x := splitmix(h + round)
		for n := min(k, 7); n > 0; n-- {
			a &= rows[int(x&(BlockBits-1))*f.words+w]
			x >>= 9
		}
		k -= 7
	}
	return a
}

// and1 is andWord for a one-word fleet (at most 64 slots), the common
// shape: one row word a position, so no multiply to find it.
func (f *Fleet) and1(key blockkey.Key, a uint64) uint64 {
	h := splitmix(uint64(key))
	base := int(((h>>32)*uint64(f.p.M/BlockBits))>>32) * BlockBits
	rows := f.rows[base : base+BlockBits]
	for k, round := int(f.p.K), uint64(1); k > 0; round++ {
		x := splitmix(h + round)
		for n := min(k, 7); n > 0; n-- {
			a &= rows[x&(BlockBits-1)]
			x >>= 9
		}
		k -= 7
	}
	return a
}

// Match gives the same answers as MatchLinear when every endpoint's cache
// is prefix-closed along the chain (vLLM frees a request's blocks tail
// first, so a held block's ancestors are held): it gallops over depth
// (keys 1, 2, 4, 8, … deep) and bisects where endpoints drop out, probing
// O(log n) keys per distinct matched length instead of every key. Where an
// endpoint holds a block whose parent it lost, or a false positive answers
// a probed depth, Match may report a longer match than MatchLinear.
// matched must have Slots() entries; it returns the longest match. Any
// number of slots: a fleet of up to 64 works on one word a set, a larger
// one on a stack of word sets sized to the chain's depth.
func (f *Fleet) Match(chain []blockkey.Key, matched []int) int {
	clear(matched)
	if len(chain) == 0 {
		return 0
	}
	if f.words == 1 {
		var all uint64
		for s, st := range f.slots[:64] {
			if st.used {
				all |= 1 << s
			}
		}
		if all != 0 {
			f.gallop1(chain, all, matched)
		}
		return f.longest(matched)
	}
	m := matcher{f: f, chain: chain, matched: matched}
	// gallop holds 2 sets; each bisect level below it 2 more, and a
	// bisect nests at most bits.Len(len(chain))+1 deep.
	m.stack = make([]uint64, 0, (2*bits.Len(uint(len(chain)))+6)*f.words)
	all := m.push()
	any := false
	for s, st := range f.slots {
		if st.used {
			all[s/64] |= 1 << (s % 64)
			any = true
		}
	}
	if any {
		m.gallop(all)
	}
	return f.longest(matched)
}

func assign1(s uint64, depth int, matched []int) {
	for ; s != 0; s &= s - 1 {
		matched[bits.TrailingZeros64(s)] = depth
	}
}

// gallop1: every slot in s holds chain[:0].
func (f *Fleet) gallop1(chain []blockkey.Key, s uint64, matched []int) {
	n, prev := len(chain), 0
	for step := 1; ; step *= 2 {
		idx := min(step-1, n-1)
		t := f.and1(chain[idx], s)
		if gone := s &^ t; gone != 0 {
			f.bisect1(chain, prev, idx, gone, matched) // they hold chain[:prev], not chain[idx]
		}
		if t == 0 {
			return
		}
		if idx == n-1 {
			assign1(t, n, matched)
			return
		}
		s, prev = t, idx+1
	}
}

// bisect1: every slot in s holds chain[:lo] and not chain[hi]; find where
// each drops out, in [lo, hi].
func (f *Fleet) bisect1(chain []blockkey.Key, lo, hi int, s uint64, matched []int) {
	for s != 0 {
		if lo == hi {
			assign1(s, lo, matched)
			return
		}
		mid := (lo + hi) / 2
		t := f.and1(chain[mid], s)
		if gone := s &^ t; gone != 0 {
			f.bisect1(chain, lo, mid, gone, matched)
		}
		s, lo = t, mid+1
	}
}

// matcher is Match's search state for a fleet of more than 64 slots: slot
// sets of f.words words each, taken from and returned to a stack.
type matcher struct {
	f       *Fleet
	chain   []blockkey.Key
	matched []int
	stack   []uint64
}

func (m *matcher) push() []uint64 {
	n := len(m.stack)
	m.stack = append(m.stack, make([]uint64, m.f.words)...)
	return m.stack[n:len(m.stack):len(m.stack)]
}

func (m *matcher) pop(sets int) { m.stack = m.stack[:len(m.stack)-sets*m.f.words] }

// eval writes into out the slots of in that may hold key and into gone
// those that may not; it reports whether out and gone are non-empty.
func (m *matcher) eval(key blockkey.Key, in, out, gone []uint64) (kept, lost bool) {
	f := m.f
	var probes [MaxK]uint32
	pos := f.p.Probes(key, &probes)
	for w, a := range in {
		if a != 0 {
			for _, p := range pos {
				a &= f.rows[int(p)*f.words+w]
				if a == 0 {
					break
				}
			}
		}
		out[w], gone[w] = a, in[w]&^a
		kept, lost = kept || a != 0, lost || gone[w] != 0
	}
	return kept, lost
}

func (m *matcher) assign(s []uint64, depth int) {
	for w, word := range s {
		for ; word != 0; word &= word - 1 {
			m.matched[w*64+bits.TrailingZeros64(word)] = depth
		}
	}
}

// gallop: every slot in s holds chain[:0]; s is the gallop's to change.
func (m *matcher) gallop(s []uint64) {
	n, prev := len(m.chain), 0
	t, gone := m.push(), m.push()
	defer m.pop(2)
	for step := 1; ; step *= 2 {
		idx := min(step-1, n-1)
		kept, lost := m.eval(m.chain[idx], s, t, gone)
		if lost {
			m.bisect(prev, idx, gone)
		}
		if !kept {
			return
		}
		if idx == n-1 {
			m.assign(t, n)
			return
		}
		copy(s, t)
		prev = idx + 1
	}
}

// bisect: every slot in s holds chain[:lo] and not chain[hi]; find where
// each drops out, in [lo, hi]. s is bisect's to change.
func (m *matcher) bisect(lo, hi int, s []uint64) {
	t, gone := m.push(), m.push()
	defer m.pop(2)
	for {
		if lo == hi {
			m.assign(s, lo)
			return
		}
		mid := (lo + hi) / 2
		kept, lost := m.eval(m.chain[mid], s, t, gone)
		if lost {
			m.bisect(lo, mid, gone)
		}
		if !kept {
			return
		}
		copy(s, t)
		lo = mid + 1
	}
}

// Verify walks chain[:n] for one slot and returns how many leading keys it
// really may hold (≤ n): the linear check of a search result, for the
// winner, against a lost parent or a false positive at a probed depth.
func (f *Fleet) Verify(chain []blockkey.Key, slot, n int) int {
	if slot < 0 || slot >= len(f.slots) || !f.slots[slot].used {
		return 0
	}
	w, bit := slot/64, uint64(1)<<(slot%64)
	n = min(n, len(chain))
	for i, key := range chain[:n] {
		if f.andWord(key, w, bit) == 0 {
			return i
		}
	}
	return n
}

// Grow makes room for at least slots endpoint slots, keeping every slot's
// bits and position. The index holds m bits per 64 slots, so a fleet
// sized to the endpoints it has keeps to 2 bytes per (endpoint, block).
func (f *Fleet) Grow(slots int) error {
	if slots > 1<<16 {
		return fmt.Errorf("summary: %d endpoint slots: at most 65536", slots)
	}
	w := (slots + 63) / 64
	if w <= f.words {
		return nil
	}
	rows := make([]uint64, int(f.p.M)*w)
	for pos := 0; pos < int(f.p.M); pos++ {
		copy(rows[pos*w:pos*w+f.words], f.rows[pos*f.words:(pos+1)*f.words])
	}
	f.rows, f.words = rows, w
	f.slots = append(f.slots, make([]slotState, w*64-len(f.slots))...)
	return nil
}
