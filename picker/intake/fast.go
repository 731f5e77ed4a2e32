package intake

import (
	"bytes"
	"slices"
	"strings"
)

// Token-id arrays are most of a token-id body's bytes; parsing them as
// generic JSON values costs several times what a dedicated loop does. The
// functions here find a top-level field's plain array of integers and
// parse it directly; the rest of the body still goes through the
// validating parser (with the array replaced by []), so nothing is
// accepted that the parser would refuse.

// fastArrays finds the top-level fields named in keys whose values are
// arrays of plain non-negative integers below 2^32, and returns their
// values and the body with each such array replaced by []. It returns
// body unchanged and nil when it finds none or the body is not a plain
// object it can walk.
func fastArrays(body []byte, keys ...string) ([]byte, map[string][]uint32) {
	type found struct {
		key        string
		start, end int
		ids        []uint32
	}
	var hits []found
	seen := map[string]bool{}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return body, nil
	}
	i++
	for {
		i = skipSpace(body, i)
		if i >= len(body) {
			return body, nil
		}
		if body[i] == '}' {
			break
		}
		if body[i] == ',' {
			i++
			continue
		}
		if body[i] != '"' {
			return body, nil
		}
		kStart := i + 1
		kEnd := skipString(body, i)
		if kEnd < 0 {
			return body, nil
		}
		key := string(body[kStart : kEnd-1])
		if strings.IndexByte(key, '\\') >= 0 {
			return body, nil // an escaped key may spell a wanted one: let the parser decide
		}
		i = skipSpace(body, kEnd)
		if i >= len(body) || body[i] != ':' {
			return body, nil
		}
		i = skipSpace(body, i+1)
		wanted := slices.Contains(keys, key)
		if wanted {
			if seen[key] {
				return body, nil // a repeated key: let the parser decide
			}
			seen[key] = true
		}
		if wanted && i < len(body) && body[i] == '[' {
			if ids, end, ok := uintArray(body, i); ok && len(ids) > 0 {
				hits = append(hits, found{key, i, end, ids})
				i = end
				continue
			}
		}
		if i = skipValue(body, i); i < 0 {
			return body, nil
		}
	}
	if len(hits) == 0 {
		return body, nil
	}
	size := len(body)
	for _, h := range hits {
		size -= h.end - h.start - 2 // each array becomes []
	}
	out := make([]byte, 0, size)
	vals := map[string][]uint32{}
	prev := 0
	for _, h := range hits {
		vals[h.key] = h.ids
		out = append(out, body[prev:h.start]...)
		out = append(out, '[', ']')
		prev = h.end
	}
	return append(out, body[prev:]...), vals
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] ('"'),
// or -1.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index after the value starting at b[i], or -1. It
// checks only structure (brackets and strings); the parser validates.
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			if i = skipString(b, i); i < 0 {
				return -1
			}
			i--
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the enclosing object's end
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',':
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// uintArray parses the array at b[i] ('[') if it holds only plain
// integers (no sign, fraction, exponent or leading zero) below 2^32.
func uintArray(b []byte, i int) (ids []uint32, end int, ok bool) {
	n := len(b)
	i = skipSpace(b, i+1)
	if i < n && b[i] == ']' {
		return nil, i + 1, true
	}
	// One id a comma, at most: a vectorised count costs a fraction of
	// the parse and sizes the array to the ids (a body of n bytes used to
	// reserve n/4 of them).
	ids = make([]uint32, 0, bytes.Count(b[i:], []byte{','})+1)
	for {
		if i >= n || b[i] < '0' || b[i] > '9' {
			return nil, 0, false
		}
		start := i
		v := uint64(b[i] - '0')
		for i++; i < n && b[i] >= '0' && b[i] <= '9'; i++ {
			v = v*10 + uint64(b[i]-'0')
		}
		if digits := i - start; digits > 10 || v > 1<<32-1 || (b[start] == '0' && digits > 1) {
			return nil, 0, false
		}
		ids = append(ids, uint32(v))
		if i < n && b[i] == ',' { // the common case: "1,2,3"
			i++
			if i < n && b[i] >= '0' && b[i] <= '9' {
				continue
			}
			i = skipSpace(b, i)
			continue
		}
		i = skipSpace(b, i)
		if i >= n {
			return nil, 0, false
		}
		switch b[i] {
		case ']':
			return ids, i + 1, true
		case ',':
			i = skipSpace(b, i+1)
		default:
			return nil, 0, false
		}
	}
}
