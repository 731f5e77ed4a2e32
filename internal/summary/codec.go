package summary

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
)

// ErrCorrupt is wrapped by every decoding error.
var ErrCorrupt = errors.New("summary: corrupt encoding")

func errCorrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// SeqError reports a delta that does not follow the state it is applied to.
type SeqError struct{ Have, Got uint64 }

func (e *SeqError) Error() string {
	return fmt.Sprintf("summary: delta %d does not follow %d", e.Got, e.Have)
}

// Encoding versions and snapshot formats.
const (
	deltaV2    = 2 // v1 (varint gaps of flips, with the seq) is retired
	snapshotV1 = 1
	fmtRaw     = 0 // the words, little-endian
	fmtSparse  = 1 // set positions, gap-encoded
)

// appendPositions writes ascending positions as a count then gaps.
func appendPositions(dst []byte, pos []uint32) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(pos)))
	prev := uint32(0)
	for i, p := range pos {
		if i == 0 {
			dst = binary.AppendUvarint(dst, uint64(p))
		} else {
			dst = binary.AppendUvarint(dst, uint64(p-prev-1))
		}
		prev = p
	}
	return dst
}

type decoder struct {
	b   []byte
	off int
}

func (d *decoder) uvarint(what string) (uint64, error) {
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		return 0, errCorrupt("bad %s at byte %d", what, d.off)
	}
	d.off += n
	return v, nil
}

func (d *decoder) byte1(what string) (byte, error) {
	if d.off >= len(d.b) {
		return 0, errCorrupt("missing %s", what)
	}
	d.off++
	return d.b[d.off-1], nil
}

// positions reads ascending positions below m. The count is checked against
// the bytes left (each takes at least one) before anything is allocated.
func (d *decoder) positions(m uint32) ([]uint32, error) {
	n, err := d.uvarint("count")
	if err != nil {
		return nil, err
	}
	if n > uint64(len(d.b)-d.off) || n > uint64(m) {
		return nil, errCorrupt("%d positions in %d bytes (m = %d)", n, len(d.b)-d.off, m)
	}
	out := make([]uint32, 0, n)
	next := uint64(0)
	for i := uint64(0); i < n; i++ {
		g, err := d.uvarint("position")
		if err != nil {
			return nil, err
		}
		p := next + g
		if g >= uint64(m) || p >= uint64(m) {
			return nil, errCorrupt("position beyond m = %d", m)
		}
		out = append(out, uint32(p))
		next = p + 1
	}
	return out, nil
}

// AppendDelta appends d's flips (its number travels beside the encoding,
// in the stream message). Format v2: a version byte, the number of touched
// BlockBits-bit rows (uvarint), one byte of Rice parameters (row gaps high
// nibble, offset gaps low), then a bit stream, least significant bit
// first: for each row in ascending order, the gap from the previous row
// (Rice), the number of flips in it (Elias gamma) and the gaps between its
// ascending offsets (Rice); zero padding to a byte. A block key's flips
// share one row, so a block costs a row gap plus a few 9-bit-range
// offsets: ≈ 7 bytes a block at capacity instead of ≈ 2 bytes a flip.
func AppendDelta(dst []byte, d Delta) []byte {
	dst = append(dst, deltaV2)
	var rowGaps, offGaps, counts []uint32
	prevRow := int64(-1)
	for i := 0; i < len(d.Flips); {
		row := d.Flips[i] / BlockBits
		rowGaps = append(rowGaps, uint32(int64(row)-prevRow-1))
		prevRow = int64(row)
		prevOff := int64(-1)
		n := 0
		for ; i < len(d.Flips) && d.Flips[i]/BlockBits == row; i++ {
			off := d.Flips[i] % BlockBits
			offGaps = append(offGaps, uint32(int64(off)-prevOff-1))
			prevOff = int64(off)
			n++
		}
		counts = append(counts, uint32(n))
	}
	dst = binary.AppendUvarint(dst, uint64(len(rowGaps)))
	if len(rowGaps) == 0 {
		return dst
	}
	kr, ko := riceParam(rowGaps, maxRowRice), riceParam(offGaps, maxOffRice)
	dst = append(dst, byte(kr<<4|ko))
	w := bitWriter{b: dst}
	o := 0
	for i, g := range rowGaps {
		w.rice(uint64(g), kr)
		w.gamma(uint64(counts[i]))
		for _, og := range offGaps[o : o+int(counts[i])] {
			w.rice(uint64(og), ko)
		}
		o += int(counts[i])
	}
	return w.flush()
}

// Rice parameter bounds: row gaps fit 2^22 rows (m ≤ 2^31), offset gaps 2^9.
const (
	maxRowRice = 15
	maxOffRice = 9
)

// riceParam returns the k in 0..maxK that codes vs in the fewest bits.
func riceParam(vs []uint32, maxK uint) uint {
	best, bestCost := uint(0), uint64(1<<63)
	for k := uint(0); k <= maxK; k++ {
		cost := uint64(len(vs)) * uint64(k+1)
		for _, v := range vs {
			cost += uint64(v >> k)
		}
		if cost < bestCost {
			best, bestCost = k, cost
		}
	}
	return best
}

// DecodeDelta decodes the flips of delta number seq for a summary of
// parameters p. Counts are checked against the bits left before anything is
// allocated, positions against m, and order is strict.
func DecodeDelta(b []byte, seq uint64, p Params) (Delta, error) {
	d := decoder{b: b}
	v, err := d.byte1("version")
	if err != nil {
		return Delta{}, err
	}
	if v != deltaV2 {
		return Delta{}, errCorrupt("delta version %d", v)
	}
	nrows, err := d.uvarint("row count")
	if err != nil {
		return Delta{}, err
	}
	rows := uint64(p.M / BlockBits)
	if nrows == 0 {
		if d.off != len(b) {
			return Delta{}, errCorrupt("%d trailing bytes", len(b)-d.off)
		}
		return Delta{Seq: seq}, nil
	}
	ks, err := d.byte1("rice parameters")
	if err != nil {
		return Delta{}, err
	}
	kr, ko := uint(ks>>4), uint(ks&0xf)
	if ko > maxOffRice {
		return Delta{}, errCorrupt("offset rice parameter %d", ko)
	}
	r := bitReader{b: b[d.off:]}
	// A row costs at least 3 bits: a gap, a count and one offset.
	if nrows > rows || nrows > r.left()/3 {
		return Delta{}, errCorrupt("%d rows in %d bits (m = %d)", nrows, r.left(), p.M)
	}
	// Grown as flips decode: a hostile stream of zero bits must not buy an
	// allocation of 32 times its size up front.
	flips := make([]uint32, 0, min(r.left(), uint64(p.M), 4096))
	next := uint64(0) // the lowest row the next one may take
	for i := uint64(0); i < nrows; i++ {
		g, err := r.rice(kr, rows)
		if err != nil {
			return Delta{}, err
		}
		row := next + g
		if row >= rows {
			return Delta{}, errCorrupt("row %d beyond m = %d", row, p.M)
		}
		next = row + 1
		n, err := r.gamma(BlockBits)
		if err != nil {
			return Delta{}, err
		}
		off := uint64(0)
		for j := uint64(0); j < n; j++ {
			og, err := r.rice(ko, BlockBits)
			if err != nil {
				return Delta{}, err
			}
			off += og
			if off >= BlockBits {
				return Delta{}, errCorrupt("offset %d beyond the row", off)
			}
			flips = append(flips, uint32(row*BlockBits+off))
			off++
		}
	}
	if err := r.end(); err != nil {
		return Delta{}, err
	}
	return Delta{Seq: seq, Flips: flips}, nil
}

// bitWriter appends bits least significant first.
type bitWriter struct {
	b   []byte
	acc uint64
	n   uint
}

func (w *bitWriter) bits(v uint64, n uint) {
	for n > 0 {
		take := min(n, 32)
		w.acc |= (v & (1<<take - 1)) << w.n
		w.n += take
		v >>= take
		n -= take
		for w.n >= 8 {
			w.b = append(w.b, byte(w.acc))
			w.acc >>= 8
			w.n -= 8
		}
	}
}

// unary writes q zeros and a one.
func (w *bitWriter) unary(q uint64) {
	for ; q >= 32; q -= 32 {
		w.bits(0, 32)
	}
	w.bits(1<<q, uint(q)+1)
}

func (w *bitWriter) rice(v uint64, k uint) {
	w.unary(v >> k)
	w.bits(v, k)
}

// gamma writes v ≥ 1 as Elias gamma: the bit length minus one in unary,
// then the bits below the leading one.
func (w *bitWriter) gamma(v uint64) {
	n := uint(bits.Len64(v)) - 1
	w.unary(uint64(n))
	w.bits(v, n)
}

func (w *bitWriter) flush() []byte {
	if w.n > 0 {
		w.b = append(w.b, byte(w.acc))
		w.acc, w.n = 0, 0
	}
	return w.b
}

// bitReader reads what bitWriter writes, refusing to read past the end.
type bitReader struct {
	b   []byte
	pos uint64 // bits read
}

func (r *bitReader) left() uint64 { return uint64(len(r.b))*8 - r.pos }

func (r *bitReader) bits(n uint) (uint64, error) {
	if uint64(n) > r.left() {
		return 0, errCorrupt("truncated bit stream")
	}
	var v uint64
	for i := uint(0); i < n; i++ {
		v |= uint64(r.b[r.pos/8]>>(r.pos%8)&1) << i
		r.pos++
	}
	return v, nil
}

// unary reads zeros up to a one; more than limit zeros is corrupt.
func (r *bitReader) unary(limit uint64) (uint64, error) {
	for q := uint64(0); q <= limit; q++ {
		if r.left() == 0 {
			return 0, errCorrupt("truncated bit stream")
		}
		bit := r.b[r.pos/8] >> (r.pos % 8) & 1
		r.pos++
		if bit == 1 {
			return q, nil
		}
	}
	return 0, errCorrupt("unary run beyond %d", limit)
}

// rice reads a Rice code of parameter k whose value must be below limit.
func (r *bitReader) rice(k uint, limit uint64) (uint64, error) {
	q, err := r.unary(limit >> k)
	if err != nil {
		return 0, err
	}
	low, err := r.bits(k)
	if err != nil {
		return 0, err
	}
	v := q<<k | low
	if v >= limit {
		return 0, errCorrupt("value %d beyond %d", v, limit)
	}
	return v, nil
}

// gamma reads an Elias gamma code of a value in 1..limit.
func (r *bitReader) gamma(limit uint64) (uint64, error) {
	n, err := r.unary(uint64(bits.Len64(limit)) - 1)
	if err != nil {
		return 0, err
	}
	low, err := r.bits(uint(n))
	if err != nil {
		return 0, err
	}
	v := 1<<n | low
	if v > limit {
		return 0, errCorrupt("count %d beyond %d", v, limit)
	}
	return v, nil
}

// end checks that only zero padding, less than a byte, is left.
func (r *bitReader) end() error {
	if r.left() >= 8 {
		return errCorrupt("%d trailing bytes", r.left()/8)
	}
	if pad, _ := r.bits(uint(r.left())); pad != 0 {
		return errCorrupt("nonzero padding")
	}
	return nil
}

// AppendSnapshot appends s's encoding: its parameters, seq, and the bitmap
// as raw words or as gap-encoded positions, whichever is smaller.
func AppendSnapshot(dst []byte, s Snapshot) []byte {
	set := 0
	for _, w := range s.Words {
		set += bits.OnesCount64(w)
	}
	// A sparse position costs ~2–3 bytes; a raw bit costs 1/8 byte.
	sparse := set*3 < len(s.Words)*8
	// Grown once: the header, then the raw words or (at most) a count and
	// a 5-byte gap a position. A sidecar encodes one for each picker that
	// syncs (a thousand streams of 128 KiB for a picker restarted at
	// 1,000 endpoints, on the machine that serves them).
	body := 8 * len(s.Words)
	if sparse {
		body = binary.MaxVarintLen64 + 5*set
	}
	dst = slices.Grow(dst, 1+2*binary.MaxVarintLen64+1+binary.MaxVarintLen64+len(s.Params.Probe)+binary.MaxVarintLen64+1+body)
	dst = append(dst, snapshotV1)
	dst = binary.AppendUvarint(dst, uint64(s.Params.M))
	dst = append(dst, s.Params.K)
	dst = binary.AppendUvarint(dst, uint64(len(s.Params.Probe)))
	dst = append(dst, s.Params.Probe...)
	dst = binary.AppendUvarint(dst, s.Seq)
	if sparse {
		pos := make([]uint32, 0, set)
		for i, w := range s.Words {
			for w != 0 {
				pos = append(pos, uint32(i*64+bits.TrailingZeros64(w)))
				w &= w - 1
			}
		}
		dst = append(dst, fmtSparse)
		return appendPositions(dst, pos)
	}
	dst = append(dst, fmtRaw)
	n := len(dst)
	dst = slices.Grow(dst, 8*len(s.Words)) // room already made above
	dst = dst[:n+8*len(s.Words)]
	for i, w := range s.Words {
		binary.LittleEndian.PutUint64(dst[n+8*i:], w)
	}
	return dst
}

// DecodeSnapshot decodes a snapshot that must have parameters want; the
// parameters are checked before the bitmap is allocated.
func DecodeSnapshot(b []byte, want Params) (Snapshot, error) {
	d := decoder{b: b}
	v, err := d.byte1("version")
	if err != nil {
		return Snapshot{}, err
	}
	if v != snapshotV1 {
		return Snapshot{}, errCorrupt("snapshot version %d", v)
	}
	m, err := d.uvarint("m")
	if err != nil {
		return Snapshot{}, err
	}
	k, err := d.byte1("k")
	if err != nil {
		return Snapshot{}, err
	}
	plen, err := d.uvarint("probe length")
	if err != nil {
		return Snapshot{}, err
	}
	if plen > 64 || plen > uint64(len(b)-d.off) {
		return Snapshot{}, errCorrupt("probe name of %d bytes", plen)
	}
	probe := string(b[d.off : d.off+int(plen)])
	d.off += int(plen)
	if m > 1<<32-1 {
		return Snapshot{}, errCorrupt("m = %d", m)
	}
	got := Params{M: uint32(m), K: k, Probe: probe}
	if err := want.Compatible(got); err != nil {
		return Snapshot{}, err
	}
	seq, err := d.uvarint("seq")
	if err != nil {
		return Snapshot{}, err
	}
	f, err := d.byte1("format")
	if err != nil {
		return Snapshot{}, err
	}
	s := Snapshot{Params: want, Seq: seq}
	switch f {
	case fmtRaw:
		nw := int(want.M / 64)
		if len(b)-d.off != nw*8 {
			return Snapshot{}, errCorrupt("raw bitmap of %d bytes, want %d", len(b)-d.off, nw*8)
		}
		s.Words = make([]uint64, nw)
		for i := range s.Words {
			s.Words[i] = binary.LittleEndian.Uint64(b[d.off+8*i:])
		}
		return s, nil
	case fmtSparse:
		pos, err := d.positions(want.M)
		if err != nil {
			return Snapshot{}, err
		}
		if d.off != len(b) {
			return Snapshot{}, errCorrupt("%d trailing bytes", len(b)-d.off)
		}
		s.Words = make([]uint64, want.M/64)
		for _, p := range pos {
			s.Words[p/64] |= 1 << (p % 64)
		}
		return s, nil
	}
	return Snapshot{}, errCorrupt("snapshot format %d", f)
}
