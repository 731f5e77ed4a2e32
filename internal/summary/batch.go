package summary

import "math/bits"

// A snapshot load writes one bit of a row word per row: loading the slots
// one after another touches every row once per slot, which for a group of
// a thousand endpoints is a thousand passes over the whole index. A
// LoadBatch writes any number of loads into one index in one pass: for
// each snapshot word, and each row word with two or more loads, it
// transposes the 64×64 bits (one word from each load) into the 64 rows'
// words and writes each row word once.

// Slot returns the slot the load writes.
func (l *SnapshotLoad) Slot() int { return l.slot }

// Fleet returns the index the load writes: loads of one index can be
// batched, one per slot.
func (l *SnapshotLoad) Fleet() *Fleet { return l.f }

// Started reports whether the load has been stepped: only unstarted
// loads can join a batch.
func (l *SnapshotLoad) Started() bool { return l.next > 0 }

// LoadBatch writes several loads of one fleet together.
type LoadBatch struct {
	f    *Fleet
	cols map[int]*[64]*SnapshotLoad // by row word: the loads by slot % 64; nil once dropped
	live int
	next int
}

// NewLoadBatch groups loads, which must be of one fleet, none started, no
// two for one slot; it reports false when they are not.
func NewLoadBatch(loads []*SnapshotLoad) (*LoadBatch, bool) {
	if len(loads) == 0 {
		return nil, false
	}
	b := &LoadBatch{f: loads[0].f, cols: map[int]*[64]*SnapshotLoad{}}
	for _, l := range loads {
		c := b.cols[l.slot/64]
		if c == nil {
			c = new([64]*SnapshotLoad)
			b.cols[l.slot/64] = c
		}
		if l.f != b.f || l.Started() || c[l.slot%64] != nil {
			return nil, false
		}
		c[l.slot%64] = l
		b.live++
	}
	return b, true
}

// Live returns how many loads are still being written.
func (b *LoadBatch) Live() int { return b.live }

// Drop takes l out of the batch, unfinished: its slot stays absent (and
// dirty: the next load of it clears it) until something else loads it.
func (b *LoadBatch) Drop(l *SnapshotLoad) {
	if c := b.cols[l.slot/64]; c != nil && c[l.slot%64] == l {
		c[l.slot%64] = nil
		b.live--
	}
}

// Step writes up to words more snapshot words of every load still live
// and reports whether the batch is complete: every live load's slot is
// then in use at its snapshot's position. Loads whose slot changed since
// LoadSnapshot drop out; abandoned lists them (each once, in the step that
// found it), and their slots are left to whatever changed them.
func (b *LoadBatch) Step(words int) (done bool, abandoned []*SnapshotLoad) {
	f := b.f
	type column struct {
		w     int
		mask  uint64
		loads *[64]*SnapshotLoad
		one   *SnapshotLoad // the column's only load, written bit by bit
	}
	cols := make([]column, 0, len(b.cols))
	for w, c := range b.cols {
		col := column{w: w, loads: c}
		n := 0
		for j, l := range c {
			if l == nil {
				continue
			}
			if f.slots[l.slot].gen != l.gen {
				abandoned = append(abandoned, l)
				c[j] = nil
				b.live--
				continue
			}
			col.mask |= 1 << j
			col.one = l
			n++
		}
		switch {
		case n == 0:
			delete(b.cols, w)
			continue
		case n > 1:
			col.one = nil
		}
		cols = append(cols, col)
	}
	total := int(f.p.M / 64)
	end := min(b.next+max(words, 1), total)
	if b.live == 0 {
		end = total
	}
	var m [64]uint64
	for i := b.next; i < end; i++ {
		base := i * 64 * f.words
		for _, c := range cols {
			if c.one != nil {
				c.one.writeWord(i)
				continue
			}
			for j, l := range c.loads {
				if l != nil {
					m[j] = l.snap.Words[i]
				} else {
					m[j] = 0
				}
			}
			transpose64(&m)
			row := base + c.w
			for r := range 64 {
				f.rows[row] = f.rows[row]&^c.mask | m[r]
				row += f.words
			}
		}
	}
	b.next = end
	if end < total {
		return false, abandoned
	}
	for _, c := range b.cols {
		for _, l := range c {
			if l != nil {
				l.next = end
				s := &f.slots[l.slot]
				s.used, s.epoch, s.seq = true, l.epoch, l.snap.Seq
			}
		}
	}
	return true, abandoned
}

// writeWord writes snapshot word i of l into its slot's bit of the word's
// 64 rows.
func (l *SnapshotLoad) writeWord(i int) {
	f := l.f
	w, shift := l.slot/64, uint(l.slot%64)
	word := l.snap.Words[i]
	if l.clean {
		for ; word != 0; word &= word - 1 {
			f.rows[(i*64+bits.TrailingZeros64(word))*f.words+w] |= 1 << shift
		}
		return
	}
	row := i * 64 * f.words
	for b := 0; b < 64; b, row = b+1, row+f.words {
		f.rows[row+w] = f.rows[row+w]&^(1<<shift) | (word>>b&1)<<shift
	}
}

// transpose64 transposes a 64×64 bit matrix in place: bit j of word i
// becomes bit i of word j. Input word j is load j's snapshot word (its
// bit r: row r of the word's 64 rows); output word r is row r's bits, bit
// j for load j. Six rounds of block swaps, halving the block each round.
func transpose64(m *[64]uint64) {
	mask := uint64(0x00000000FFFFFFFF)
	for j := 32; j != 0; j, mask = j>>1, mask^(mask<<(j>>1)) {
		for k := 0; k < 64; k = (k + j + 1) &^ j {
			t := (m[k]>>j ^ m[k+j]) & mask
			m[k] ^= t << j
			m[k+j] ^= t
		}
	}
}
