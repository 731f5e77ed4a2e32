package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrMalformed is wrapped by every decoding error, so callers can count
// malformed payloads with errors.Is.
var ErrMalformed = errors.New("kvevents: malformed payload")

// msgpack format bytes used by vLLM's encoder (msgspec) and accepted here.
const (
	mpNil      = 0xc0
	mpFalse    = 0xc2
	mpTrue     = 0xc3
	mpBin8     = 0xc4
	mpBin16    = 0xc5
	mpBin32    = 0xc6
	mpExt8     = 0xc7
	mpExt16    = 0xc8
	mpExt32    = 0xc9
	mpFloat32  = 0xca
	mpFloat64  = 0xcb
	mpUint8    = 0xcc
	mpUint16   = 0xcd
	mpUint32   = 0xce
	mpUint64   = 0xcf
	mpInt8     = 0xd0
	mpInt16    = 0xd1
	mpInt32    = 0xd2
	mpInt64    = 0xd3
	mpFixExt1  = 0xd4
	mpFixExt2  = 0xd5
	mpFixExt4  = 0xd6
	mpFixExt8  = 0xd7
	mpFixExt16 = 0xd8
	mpStr8     = 0xd9
	mpStr16    = 0xda
	mpStr32    = 0xdb
	mpArray16  = 0xdc
	mpArray32  = 0xdd
	mpMap16    = 0xde
	mpMap32    = 0xdf
)

// reader walks a msgpack buffer. Every read checks bounds first; lengths from
// the wire are compared with the bytes left before anything is sized by them.
type reader struct {
	b   []byte
	off int
}

func (r *reader) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrMalformed, r.off, fmt.Sprintf(format, args...))
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.errorf("unexpected end of data")
	}
	return r.b[r.off], nil
}

func (r *reader) byte1() (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.errorf("unexpected end of data")
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

// take returns the next n bytes without copying.
func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, r.errorf("length %d exceeds the %d bytes left", n, r.left())
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s, nil
}

func (r *reader) uintN(n int) (uint64, error) {
	s, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	default:
		return binary.BigEndian.Uint64(s), nil
	}
}

// tryNil consumes a nil and reports whether there was one.
func (r *reader) tryNil() bool {
	if r.off < len(r.b) && r.b[r.off] == mpNil {
		r.off++
		return true
	}
	return false
}

// arrayLen reads an array header. Each element takes at least one byte, so a
// count larger than the bytes left is rejected before anything is sized by it.
func (r *reader) arrayLen() (int, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x90 && c <= 0x9f:
		n = uint64(c & 0x0f)
	case c == mpArray16:
		n, err = r.uintN(2)
	case c == mpArray32:
		n, err = r.uintN(4)
	default:
		r.off--
		return 0, r.errorf("expected an array, found format 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(r.left()) {
		return 0, r.errorf("array of %d elements in %d bytes", n, r.left())
	}
	return int(n), nil
}

// mapLen reads a map header; each entry takes at least two bytes.
func (r *reader) mapLen() (int, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		n = uint64(c & 0x0f)
	case c == mpMap16:
		n, err = r.uintN(2)
	case c == mpMap32:
		n, err = r.uintN(4)
	default:
		r.off--
		return 0, r.errorf("expected a map, found format 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(r.left())/2 {
		return 0, r.errorf("map of %d entries in %d bytes", n, r.left())
	}
	return int(n), nil
}

// strBytes reads a string and returns its bytes without copying.
func (r *reader) strBytes() ([]byte, error) {
	c, err := r.byte1()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c == mpStr8:
		n, err = r.uintN(1)
	case c == mpStr16:
		n, err = r.uintN(2)
	case c == mpStr32:
		n, err = r.uintN(4)
	default:
		r.off--
		return nil, r.errorf("expected a string, found format 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(r.left()) {
		return nil, r.errorf("string of %d bytes in %d bytes", n, r.left())
	}
	return r.take(int(n))
}

// optString reads a string or nil ("" for nil).
func (r *reader) optString() (string, error) {
	if r.tryNil() {
		return "", nil
	}
	s, err := r.strBytes()
	return string(s), err
}

func (r *reader) binBytes() ([]byte, error) {
	c, err := r.byte1()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch c {
	case mpBin8:
		n, err = r.uintN(1)
	case mpBin16:
		n, err = r.uintN(2)
	case mpBin32:
		n, err = r.uintN(4)
	default:
		r.off--
		return nil, r.errorf("expected bytes, found format 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(r.left()) {
		return nil, r.errorf("bytes of length %d in %d bytes", n, r.left())
	}
	return r.take(int(n))
}

// integer reads any msgpack integer. neg reports a negative value, in which
// case v holds its two's-complement bits.
func (r *reader) integer() (v uint64, neg bool, err error) {
	c, err := r.byte1()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), false, nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, nil
	}
	switch c {
	case mpUint8:
		v, err = r.uintN(1)
	case mpUint16:
		v, err = r.uintN(2)
	case mpUint32:
		v, err = r.uintN(4)
	case mpUint64:
		v, err = r.uintN(8)
	case mpInt8:
		v, err = r.uintN(1)
		v = uint64(int64(int8(v)))
	case mpInt16:
		v, err = r.uintN(2)
		v = uint64(int64(int16(v)))
	case mpInt32:
		v, err = r.uintN(4)
		v = uint64(int64(int32(v)))
	case mpInt64:
		v, err = r.uintN(8)
	default:
		r.off--
		return 0, false, r.errorf("expected an integer, found format 0x%02x", c)
	}
	if err != nil {
		return 0, false, err
	}
	if c >= mpInt8 && c <= mpInt64 {
		neg = int64(v) < 0
	}
	return v, neg, nil
}

// int64v reads an integer that must fit in int64.
func (r *reader) int64v() (int64, error) {
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, r.errorf("integer %d out of range", v)
	}
	return int64(v), nil
}

func (r *reader) optInt() (OptInt, error) {
	if r.tryNil() {
		return OptInt{}, nil
	}
	v, err := r.int64v()
	return OptInt{Value: v, Valid: err == nil}, err
}

// float reads a float64, float32 or integer as float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case mpFloat64:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	case mpFloat32:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	}
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if neg {
		return float64(int64(v)), nil
	}
	return float64(v), nil
}

// skip consumes one value of any type, nesting at most depth levels.
func (r *reader) skip(depth int) error {
	if depth <= 0 {
		return r.errorf("nesting deeper than %d", MaxDepth)
	}
	c, err := r.byte1()
	if err != nil {
		return err
	}
	var n uint64
	switch {
	case c <= 0x7f || c >= 0xe0 || c == mpNil || c == mpFalse || c == mpTrue:
		return nil
	case c >= 0xa0 && c <= 0xbf:
		_, err = r.take(int(c & 0x1f))
		return err
	case c >= 0x90 && c <= 0x9f:
		return r.skipN(uint64(c&0x0f), depth)
	case c >= 0x80 && c <= 0x8f:
		return r.skipN(2*uint64(c&0x0f), depth)
	}
	switch c {
	case mpUint8, mpInt8:
		_, err = r.take(1)
	case mpUint16, mpInt16:
		_, err = r.take(2)
	case mpUint32, mpInt32, mpFloat32:
		_, err = r.take(4)
	case mpUint64, mpInt64, mpFloat64:
		_, err = r.take(8)
	case mpStr8, mpBin8:
		if n, err = r.uintN(1); err == nil {
			err = r.skipBytes(n)
		}
	case mpStr16, mpBin16:
		if n, err = r.uintN(2); err == nil {
			err = r.skipBytes(n)
		}
	case mpStr32, mpBin32:
		if n, err = r.uintN(4); err == nil {
			err = r.skipBytes(n)
		}
	case mpFixExt1:
		_, err = r.take(2)
	case mpFixExt2:
		_, err = r.take(3)
	case mpFixExt4:
		_, err = r.take(5)
	case mpFixExt8:
		_, err = r.take(9)
	case mpFixExt16:
		_, err = r.take(17)
	case mpExt8:
		if n, err = r.uintN(1); err == nil {
			err = r.skipBytes(n + 1)
		}
	case mpExt16:
		if n, err = r.uintN(2); err == nil {
			err = r.skipBytes(n + 1)
		}
	case mpExt32:
		if n, err = r.uintN(4); err == nil {
			err = r.skipBytes(n + 1)
		}
	case mpArray16:
		if n, err = r.uintN(2); err == nil {
			err = r.skipN(n, depth)
		}
	case mpArray32:
		if n, err = r.uintN(4); err == nil {
			err = r.skipN(n, depth)
		}
	case mpMap16:
		if n, err = r.uintN(2); err == nil {
			err = r.skipN(2*n, depth)
		}
	case mpMap32:
		if n, err = r.uintN(4); err == nil {
			err = r.skipN(2*n, depth)
		}
	default:
		r.off--
		return r.errorf("unknown format 0x%02x", c)
	}
	return err
}

func (r *reader) skipBytes(n uint64) error {
	if n > uint64(r.left()) {
		return r.errorf("length %d exceeds the %d bytes left", n, r.left())
	}
	r.off += int(n)
	return nil
}

func (r *reader) skipN(n uint64, depth int) error {
	if n > uint64(r.left()) {
		return r.errorf("%d elements in %d bytes", n, r.left())
	}
	for i := uint64(0); i < n; i++ {
		if err := r.skip(depth - 1); err != nil {
			return err
		}
	}
	return nil
}

// value reads a generic value for extra keys: nil, bool, int64, uint64 (only
// above MaxInt64), float64, string, []byte or []any. Maps and extension types
// never appear in vLLM's extra keys and are rejected.
func (r *reader) value(depth int) (any, error) {
	if depth <= 0 {
		return nil, r.errorf("nesting deeper than %d", MaxDepth)
	}
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c == mpNil:
		r.off++
		return nil, nil
	case c == mpTrue || c == mpFalse:
		r.off++
		return c == mpTrue, nil
	case c <= 0x7f || c >= 0xe0 || (c >= mpUint8 && c <= mpInt64):
		v, neg, err := r.integer()
		if err != nil {
			return nil, err
		}
		if !neg && v > math.MaxInt64 {
			return v, nil
		}
		return int64(v), nil
	case c == mpFloat32 || c == mpFloat64:
		return r.float()
	case (c >= 0xa0 && c <= 0xbf) || (c >= mpStr8 && c <= mpStr32):
		s, err := r.strBytes()
		return string(s), err
	case c >= mpBin8 && c <= mpBin32:
		b, err := r.binBytes()
		if err != nil {
			return nil, err
		}
		return append([]byte(nil), b...), nil
	case (c >= 0x90 && c <= 0x9f) || c == mpArray16 || c == mpArray32:
		n, err := r.arrayLen()
		if err != nil {
			return nil, err
		}
		items := make([]any, 0, n)
		for i := 0; i < n; i++ {
			v, err := r.value(depth - 1)
			if err != nil {
				return nil, err
			}
			items = append(items, v)
		}
		return items, nil
	}
	return nil, r.errorf("unsupported format 0x%02x in extra keys", c)
}
