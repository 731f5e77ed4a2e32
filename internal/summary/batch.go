package summary

// A snapshot load writes one bit of a row word per row: loading the slots
// of a row word one after another touches every row once per slot, which
// for a group of a thousand endpoints is a thousand passes over the whole
// index. A LoadBatch writes up to 64 loads into the same row word in one
// pass: for each snapshot word it transposes the 64×64 bits (one word
// from each load) into the 64 rows' words and writes each row word once.

// Slot returns the slot the load writes.
func (l *SnapshotLoad) Slot() int { return l.slot }

// Column returns the row word the load writes (its slot / 64): loads with
// the same fleet and column can be batched.
func (l *SnapshotLoad) Column() int { return l.slot / 64 }

// Fleet returns the index the load writes.
func (l *SnapshotLoad) Fleet() *Fleet { return l.f }

// Started reports whether the load has been stepped: only unstarted
// loads can join a batch.
func (l *SnapshotLoad) Started() bool { return l.next > 0 }

// LoadBatch writes several loads of one fleet and column together.
type LoadBatch struct {
	f     *Fleet
	w     int
	loads []*SnapshotLoad // live; nil once abandoned
	next  int
}

// NewLoadBatch groups loads, which must be of the same fleet and column,
// none started, no two for one slot; it reports false when they are not.
// One load is a batch too (it is then written as Step writes it).
func NewLoadBatch(loads []*SnapshotLoad) (*LoadBatch, bool) {
	if len(loads) == 0 {
		return nil, false
	}
	f, w := loads[0].f, loads[0].Column()
	var seen uint64
	for _, l := range loads {
		bit := uint64(1) << (l.slot % 64)
		if l.f != f || l.Column() != w || l.Started() || seen&bit != 0 {
			return nil, false
		}
		seen |= bit
	}
	return &LoadBatch{f: f, w: w, loads: append([]*SnapshotLoad(nil), loads...)}, true
}

// Drop takes l out of the batch, unfinished: its slot stays absent (and
// dirty: the next load of it clears it) until something else loads it.
func (b *LoadBatch) Drop(l *SnapshotLoad) {
	for i, o := range b.loads {
		if o == l {
			b.loads[i] = nil
		}
	}
}

// Step writes up to words more snapshot words of every load still live
// and reports whether the batch is complete: every live load's slot is
// then in use at its snapshot's position. Loads whose slot changed since
// LoadSnapshot drop out; abandoned lists them (each once, in the step that
// found it), and their slots are left to whatever changed them.
func (b *LoadBatch) Step(words int) (done bool, abandoned []*SnapshotLoad) {
	f := b.f
	var mask uint64
	live := 0
	for i, l := range b.loads {
		if l == nil {
			continue
		}
		if f.slots[l.slot].gen != l.gen {
			abandoned = append(abandoned, l)
			b.loads[i] = nil
			continue
		}
		mask |= 1 << (l.slot % 64)
		live++
	}
	total := int(f.p.M / 64)
	end := min(b.next+max(words, 1), total)
	switch {
	case live == 0:
		end = total
	case live == 1:
		for _, l := range b.loads {
			if l != nil {
				l.Step(end - b.next) // the single-slot writer; the gen was checked above
			}
		}
	default:
		var m [64]uint64
		for i := b.next; i < end; i++ {
			clear(m[:])
			for _, l := range b.loads {
				if l != nil {
					m[l.slot%64] = l.snap.Words[i]
				}
			}
			transpose64(&m)
			row := i*64*f.words + b.w
			for r := range 64 {
				f.rows[row] = f.rows[row]&^mask | m[r]
				row += f.words
			}
		}
		for _, l := range b.loads {
			if l != nil {
				l.next = end
			}
		}
	}
	b.next = end
	if end < total {
		return false, abandoned
	}
	for _, l := range b.loads {
		if l != nil {
			s := &f.slots[l.slot]
			s.used, s.epoch, s.seq = true, l.epoch, l.snap.Seq
		}
	}
	return true, abandoned
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
