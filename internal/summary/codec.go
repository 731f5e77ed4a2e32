package summary

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
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
	deltaV1    = 1
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

// AppendDelta appends d's encoding.
func AppendDelta(dst []byte, d Delta) []byte {
	dst = append(dst, deltaV1)
	dst = binary.AppendUvarint(dst, d.Seq)
	return appendPositions(dst, d.Flips)
}

// DecodeDelta decodes a delta for a summary of parameters p.
func DecodeDelta(b []byte, p Params) (Delta, error) {
	d := decoder{b: b}
	v, err := d.byte1("version")
	if err != nil {
		return Delta{}, err
	}
	if v != deltaV1 {
		return Delta{}, errCorrupt("delta version %d", v)
	}
	seq, err := d.uvarint("seq")
	if err != nil {
		return Delta{}, err
	}
	flips, err := d.positions(p.M)
	if err != nil {
		return Delta{}, err
	}
	if d.off != len(b) {
		return Delta{}, errCorrupt("%d trailing bytes", len(b)-d.off)
	}
	return Delta{Seq: seq, Flips: flips}, nil
}

// AppendSnapshot appends s's encoding: its parameters, seq, and the bitmap
// as raw words or as gap-encoded positions, whichever is smaller.
func AppendSnapshot(dst []byte, s Snapshot) []byte {
	dst = append(dst, snapshotV1)
	dst = binary.AppendUvarint(dst, uint64(s.Params.M))
	dst = append(dst, s.Params.K)
	dst = binary.AppendUvarint(dst, uint64(len(s.Params.Probe)))
	dst = append(dst, s.Params.Probe...)
	dst = binary.AppendUvarint(dst, s.Seq)
	set := 0
	for _, w := range s.Words {
		set += bits.OnesCount64(w)
	}
	// A sparse position costs ~2–3 bytes; a raw bit costs 1/8 byte.
	if set*3 < len(s.Words)*8 {
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
	for _, w := range s.Words {
		dst = binary.LittleEndian.AppendUint64(dst, w)
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
