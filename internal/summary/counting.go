package summary

import (
	"math/bits"
	"slices"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// Counting is one endpoint-tier's counting summary (the sidecar's side).
// Counters are 4 bits, two to a byte. They saturate at 15 and then stay (a
// saturated counter can no longer be decremented safely); at 16 bits per
// key a position holds 0.5 keys on average, so 15 is reached with
// probability below 1e-15 per position at capacity.
type Counting struct {
	p         Params
	counters  []uint8  // nibble i%2 of byte i/2 counts position i
	bits      []uint64 // bit i set ⇔ counters[i] > 0
	published []uint64 // the bitmap as of the last delta
	dirty     []uint64 // positions touched since the last delta
	touched   []uint32 // the dirty positions, unordered
	seq       uint64   // number of the last delta taken
	keys      int      // keys added minus removed
	saturated int
}

// NewCounting returns an empty summary. p must be valid.
func NewCounting(p Params) *Counting {
	words := p.M / 64
	return &Counting{
		p:         p,
		counters:  make([]uint8, p.M/2),
		bits:      make([]uint64, words),
		published: make([]uint64, words),
		dirty:     make([]uint64, words),
	}
}

// Params returns the summary's parameters.
func (c *Counting) Params() Params { return c.p }

// Keys returns the keys added and not removed.
func (c *Counting) Keys() int { return c.keys }

// Seq returns the number of the last delta taken (0 before any).
func (c *Counting) Seq() uint64 { return c.seq }

// Saturated returns how many counters have saturated.
func (c *Counting) Saturated() int { return c.saturated }

func (c *Counting) touch(pos uint32) {
	w, b := pos/64, uint64(1)<<(pos%64)
	if c.dirty[w]&b == 0 {
		c.dirty[w] |= b
		c.touched = append(c.touched, pos)
	}
}

const maxCount = 15

func (c *Counting) count(pos uint32) uint8 { return c.counters[pos/2] >> (4 * (pos % 2)) & 0xf }

func (c *Counting) setCount(pos uint32, n uint8) {
	shift := 4 * (pos % 2)
	c.counters[pos/2] = c.counters[pos/2]&^(0xf<<shift) | n<<shift
}

// Add counts key in.
func (c *Counting) Add(key blockkey.Key) {
	var buf [MaxK]uint32
	for _, pos := range c.p.Probes(key, &buf) {
		switch n := c.count(pos); n {
		case maxCount:
		case 0:
			c.setCount(pos, 1)
			c.bits[pos/64] |= 1 << (pos % 64)
			c.touch(pos)
		case maxCount - 1:
			c.setCount(pos, maxCount)
			c.saturated++
		default:
			c.setCount(pos, n+1)
		}
	}
	c.keys++
}

// Remove counts key out. Removing a key that was never added corrupts the
// summary; the caller (an exact index) guarantees it does not.
func (c *Counting) Remove(key blockkey.Key) {
	var buf [MaxK]uint32
	for _, pos := range c.p.Probes(key, &buf) {
		switch n := c.count(pos); n {
		case maxCount, 0:
		case 1:
			c.setCount(pos, 0)
			c.bits[pos/64] &^= 1 << (pos % 64)
			c.touch(pos)
		default:
			c.setCount(pos, n-1)
		}
	}
	c.keys--
}

// MayContain reports whether every probe bit of key is set.
func (c *Counting) MayContain(key blockkey.Key) bool {
	return mayContain(c.p, c.bits, key)
}

func mayContain(p Params, words []uint64, key blockkey.Key) bool {
	var buf [MaxK]uint32
	for _, pos := range p.Probes(key, &buf) {
		if words[pos/64]&(1<<(pos%64)) == 0 {
			return false
		}
	}
	return true
}

// Fill returns the fraction of bits set.
func (c *Counting) Fill() float64 {
	n := 0
	for _, w := range c.bits {
		n += bits.OnesCount64(w)
	}
	return float64(n) / float64(c.p.M)
}

// Pending reports whether flips await the next delta.
func (c *Counting) Pending() bool { return len(c.touched) > 0 }

// Delta is a numbered set of bit flips.
type Delta struct {
	Seq   uint64
	Flips []uint32 // positions whose bit changed, ascending
}

// TakeDelta returns the flips since the last delta, numbered Seq()+1, and
// ok=false (no number used) when nothing changed.
func (c *Counting) TakeDelta() (Delta, bool) {
	var flips []uint32
	if len(c.touched) > len(c.dirty)/4 {
		// Many positions touched: walking the dirty bitmap yields them in
		// order, cheaper than sorting.
		for w, d := range c.dirty {
			if d == 0 {
				continue
			}
			changed := (c.bits[w] ^ c.published[w]) & d
			c.published[w] ^= changed
			c.dirty[w] = 0
			for changed != 0 {
				flips = append(flips, uint32(w*64+bits.TrailingZeros64(changed)))
				changed &= changed - 1
			}
		}
	} else {
		for _, pos := range c.touched {
			w, b := pos/64, uint64(1)<<(pos%64)
			c.dirty[w] &^= b
			if (c.bits[w]^c.published[w])&b != 0 {
				c.published[w] ^= b
				flips = append(flips, pos)
			}
		}
		slices.Sort(flips)
	}
	c.touched = c.touched[:0]
	if len(flips) == 0 {
		return Delta{}, false
	}
	c.seq++
	return Delta{Seq: c.seq, Flips: flips}, true
}

// Snapshot is a whole bitmap as of delta Seq.
type Snapshot struct {
	Params Params
	Seq    uint64
	Words  []uint64
}

// Snapshot returns the published bitmap (as of the last delta) — pending
// flips go out in the next delta, so snapshot plus later deltas is exact.
func (c *Counting) Snapshot() Snapshot {
	return Snapshot{Params: c.p, Seq: c.seq, Words: slices.Clone(c.published)}
}

// Reset empties the summary and restarts delta numbering (a new epoch).
func (c *Counting) Reset() {
	clear(c.counters)
	clear(c.bits)
	clear(c.published)
	clear(c.dirty)
	c.touched = c.touched[:0]
	c.seq, c.keys, c.saturated = 0, 0, 0
}

// MayContain reports whether every probe bit of key is set in s.
func (s *Snapshot) MayContain(key blockkey.Key) bool { return mayContain(s.Params, s.Words, key) }

// Apply flips d's positions in s and advances s to d.Seq. Deltas must come
// in order: d.Seq == s.Seq+1.
func (s *Snapshot) Apply(d Delta) error {
	if d.Seq != s.Seq+1 {
		return &SeqError{Have: s.Seq, Got: d.Seq}
	}
	for _, pos := range d.Flips {
		if pos >= s.Params.M {
			return errCorrupt("flip position %d beyond m = %d", pos, s.Params.M)
		}
	}
	for _, pos := range d.Flips {
		s.Words[pos/64] ^= 1 << (pos % 64)
	}
	s.Seq = d.Seq
	return nil
}
