package summary

import "math/bits"

// A snapshot load writes one bit of a row word per row: loading the slots
// one after another touches every row once per slot, which for a group of
// a thousand endpoints is a thousand passes over the whole index. A
// LoadBatch writes any number of loads into one index in one lap of its
// rows: for each snapshot word, and each row word with loads, it
// transposes the 64×64 bits (one word from each load) into the 64 rows'
// words and writes each row word once.
//
// The lap is a cursor going round the snapshot words. A load joins the
// batch (Add) at the cursor, wherever it is, and is written once the
// cursor has come round to where it joined: loads that arrive while
// others are being written join them at once instead of waiting for a
// pass to end, so the last load of a sync is written one lap after it
// arrives.
//
// Each step is prepared, then committed. Prepare reads only the loads'
// snapshots (the transposes, most of the work); Commit writes the index
// (the row words, the slots' checks and positions). A caller that guards
// the index with a lock holds it for Commit alone.

// Slot returns the slot the load writes.
func (l *SnapshotLoad) Slot() int { return l.slot }

// Fleet returns the index the load writes: loads of one index can be
// batched, one per slot.
func (l *SnapshotLoad) Fleet() *Fleet { return l.f }

// Started reports whether the load has been stepped or batched: only a
// load neither can join a batch.
func (l *SnapshotLoad) Started() bool { return l.next > 0 || l.batched }

// LoadBatch writes the loads of one fleet together (see above). It is
// not safe for concurrent use; Prepare needs no access to the fleet,
// Add, Drop and Commit do (Commit writes it).
type LoadBatch struct {
	f     *Fleet
	total int // words a snapshot has
	next  int // the cursor: the next snapshot word to write
	cols  []*loadColumn
	byW   map[int]*loadColumn // cols by row word
	live  int
	zero  []uint64 // total zero words: the snapshot of a load absent from a column
	prep  prepared
	buf   []uint64 // the prepared row words: 64 per column and snapshot word
	stage []uint64 // one column's loads' words for a step, load by load
}

// loadColumn is the loads of one row word (64 slots).
type loadColumn struct {
	w     int
	mask  uint64 // the slots (bits) with a load
	loads [64]*SnapshotLoad
	src   [64][]uint64 // each load's snapshot words; zero where none
}

// prepared is a step's plan: words from..from+n of the columns as they
// were (the buffer holds their transposes, column-major within a word).
type prepared struct {
	ok      bool
	from, n int
	cols    []*loadColumn
	masks   []uint64
}

// NewLoadBatch returns an empty batch for f's loads.
func NewLoadBatch(f *Fleet) *LoadBatch {
	total := int(f.p.M / 64)
	return &LoadBatch{f: f, total: total, byW: map[int]*loadColumn{}, zero: make([]uint64, total)}
}

// Add makes l join the lap under way, and reports whether it did: not
// when l is of another fleet, stepped or batched already, or when a load
// of its slot is still in the batch (the later load abandons that one,
// which leaves at the next Commit: add it after), nor between Prepare
// and Commit.
func (b *LoadBatch) Add(l *SnapshotLoad) bool {
	if l.f != b.f || l.Started() || b.prep.ok {
		return false
	}
	c := b.byW[l.slot/64]
	if c == nil {
		c = &loadColumn{w: l.slot / 64}
		for j := range c.src {
			c.src[j] = b.zero
		}
		b.byW[c.w] = c
		b.cols = append(b.cols, c)
	}
	j := l.slot % 64
	if c.loads[j] != nil {
		return false
	}
	c.loads[j], c.src[j], c.mask = l, l.snap.Words, c.mask|1<<j
	l.batched, l.left = true, b.total
	b.live++
	return true
}

// Live returns how many loads are still being written.
func (b *LoadBatch) Live() int { return b.live }

// Columns returns how many row words have loads being written: a step's
// work is its words times its columns.
func (b *LoadBatch) Columns() int { return len(b.cols) }

// Drop takes l out of the batch, unfinished: its slot stays absent (and
// dirty: the next load of it clears it) until something else loads it.
func (b *LoadBatch) Drop(l *SnapshotLoad) {
	if c := b.byW[l.slot/64]; c != nil && c.loads[l.slot%64] == l {
		b.remove(c, l.slot%64)
	}
}

func (b *LoadBatch) remove(c *loadColumn, j int) {
	c.loads[j], c.src[j], c.mask = nil, b.zero, c.mask&^(1<<j)
	b.live--
	if c.mask != 0 {
		return
	}
	delete(b.byW, c.w)
	for i, o := range b.cols {
		if o == c {
			b.cols = append(b.cols[:i], b.cols[i+1:]...)
			break
		}
	}
}

// Prepare plans the next step — up to words snapshot words, fewer where a
// load's lap or the end of the words comes first — and does its
// transposes. It reads the loads' snapshots only, never the fleet.
func (b *LoadBatch) Prepare(words int) {
	n := min(max(words, 1), b.total-b.next)
	for _, c := range b.cols {
		for m := c.mask; m != 0; m &= m - 1 {
			n = min(n, c.loads[bits.TrailingZeros64(m)].left)
		}
	}
	p := &b.prep
	p.ok, p.from, p.n = true, b.next, n
	p.cols, p.masks = append(p.cols[:0], b.cols...), p.masks[:0]
	for _, c := range b.cols {
		p.masks = append(p.masks, c.mask)
	}
	nc := len(b.cols)
	if size := n * nc * 64; cap(b.buf) < size {
		b.buf = make([]uint64, size)
	}
	b.buf = b.buf[:n*nc*64]
	if cap(b.stage) < 64*n {
		b.stage = make([]uint64, 64*n)
	}
	stage := b.stage[:64*n]
	// A column at a time, each load's n words first copied out in one
	// run: read across a thousand snapshots a word at a time, the words
	// come from memory at a third of the speed (BenchmarkFleetLoad).
	for ci, c := range b.cols {
		for j := range 64 {
			copy(stage[j*n:(j+1)*n], c.src[j][p.from:p.from+n])
		}
		for k := range n {
			off := (k*nc + ci) * 64
			m := (*[64]uint64)(b.buf[off : off+64])
			for j := range m {
				m[j] = stage[j*n+k]
			}
			transpose64(m)
		}
	}
}

// Commit writes the prepared step and moves the cursor on. Loads whose
// slot changed since LoadSnapshot leave unwritten: abandoned lists them
// (each once, in the Commit that found it), and their slots are left to
// whatever changed them. Loads whose lap the step completes leave
// written: their slots are then in use at their snapshots' positions
// (finished). Without a prepared step it does nothing.
func (b *LoadBatch) Commit() (finished, abandoned []*SnapshotLoad) {
	p := &b.prep
	if !p.ok {
		return nil, nil
	}
	p.ok = false
	f := b.f
	for _, c := range p.cols {
		for m := c.mask; m != 0; m &= m - 1 {
			j := bits.TrailingZeros64(m)
			if l := c.loads[j]; f.slots[l.slot].gen != l.gen {
				abandoned = append(abandoned, l)
				b.remove(c, j)
			}
		}
	}
	off := 0
	for i := p.from; i < p.from+p.n; i++ {
		base := i * 64 * f.words
		for k, c := range p.cols {
			mask := p.masks[k] & c.mask // dropped or abandoned since Prepare: not written
			if mask == 0 {
				off += 64
				continue
			}
			src := (*[64]uint64)(b.buf[off : off+64])
			row := base + c.w
			for r := range src {
				f.rows[row] = f.rows[row]&^mask | src[r]&mask
				row += f.words
			}
			off += 64
		}
	}
	if b.next += p.n; b.next == b.total {
		b.next = 0
	}
	for _, c := range p.cols {
		for m := c.mask; m != 0; m &= m - 1 {
			j := bits.TrailingZeros64(m)
			l := c.loads[j]
			if l.left -= p.n; l.left > 0 {
				continue
			}
			l.next = b.total
			s := &f.slots[l.slot]
			s.used, s.epoch, s.seq = true, l.epoch, l.snap.Seq
			finished = append(finished, l)
			b.remove(c, j)
		}
	}
	return finished, abandoned
}

// Step prepares and commits one step of up to words snapshot words.
func (b *LoadBatch) Step(words int) (finished, abandoned []*SnapshotLoad) {
	b.Prepare(words)
	return b.Commit()
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
