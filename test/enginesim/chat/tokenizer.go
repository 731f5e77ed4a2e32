package chat

import (
	"fmt"
	"strconv"
)

// Special tokens. Ids below FirstPieceID are reserved for special tokens;
// only the ones listed here have names.
const (
	EndOfText    uint32 = 1 // "<|endoftext|>"
	ImStart      uint32 = 2 // "<|im_start|>"
	ImEnd        uint32 = 3 // "<|im_end|>"
	FirstPieceID uint32 = 1000
)

// Offsets of the piece id ranges for pieces of 1, 2 and 3 bytes.
const (
	oneByteBase   = FirstPieceID
	twoByteBase   = oneByteBase + 1<<8
	threeByteBase = twoByteBase + 1<<16
)

// VocabSize is the number of token ids: every id in [0, VocabSize) is valid.
// Reserved ids without a name decode as "<|reserved_N|>".
const VocabSize uint32 = threeByteBase + 1<<24

// maxPiece is the maximum number of bytes in one piece.
const maxPiece = 3

// Encode tokenizes text. No special tokens are recognised in text:
// "<|im_start|>" typed by a user is ordinary text.
func Encode(text string) []uint32 {
	return AppendEncode(nil, text)
}

// AppendEncode appends the tokens of text to dst and returns the extended slice.
func AppendEncode(dst []uint32, text string) []uint32 {
	n := len(text)
	for i := 0; i < n; {
		b := text[i]
		switch {
		case isWord(b), b == ' ' && i+1 < n && isWord(text[i+1]):
			// A word, optionally with one leading space.
			j := i + 1
			for j < n && isWord(text[j]) {
				j++
			}
			dst = appendChunks(dst, text[i:j])
			i = j
		case isSpace(b):
			j := i + 1
			for j < n && isSpace(text[j]) {
				j++
			}
			// A final ' ' directly followed by a word becomes that
			// word's leading space. The run has at least two bytes
			// here, otherwise the first case would have matched.
			if j < n && isWord(text[j]) && text[j-1] == ' ' {
				j--
			}
			dst = appendChunks(dst, text[i:j])
			i = j
		default:
			dst = append(dst, pieceID(text[i:i+1]))
			i++
		}
	}
	return dst
}

// appendChunks cuts s into pieces of at most maxPiece bytes.
func appendChunks(dst []uint32, s string) []uint32 {
	for len(s) > maxPiece {
		dst = append(dst, pieceID(s[:maxPiece]))
		s = s[maxPiece:]
	}
	if len(s) > 0 {
		dst = append(dst, pieceID(s))
	}
	return dst
}

// isWord reports whether b belongs to a word: an ASCII letter or digit, or
// any byte >= 0x80 (so UTF-8 sequences stay in words).
func isWord(b byte) bool {
	return b >= 0x80 || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}

func isSpace(b byte) bool {
	return b == ' ' || b == '\t' || b == '\n' || b == '\r'
}

// pieceID maps a byte string of length 1..3 to its id.
func pieceID(p string) uint32 {
	switch len(p) {
	case 1:
		return oneByteBase + uint32(p[0])
	case 2:
		return twoByteBase + (uint32(p[0])<<8 | uint32(p[1]))
	default:
		return threeByteBase + (uint32(p[0])<<16 | uint32(p[1])<<8 | uint32(p[2]))
	}
}

// appendPiece appends the bytes of piece id (id >= FirstPieceID, < VocabSize).
func appendPiece(dst []byte, id uint32) []byte {
	switch {
	case id < twoByteBase:
		v := id - oneByteBase
		return append(dst, byte(v))
	case id < threeByteBase:
		v := id - twoByteBase
		return append(dst, byte(v>>8), byte(v))
	default:
		v := id - threeByteBase
		return append(dst, byte(v>>16), byte(v>>8), byte(v))
	}
}

// specialName returns the text of a reserved id (< FirstPieceID).
func specialName(id uint32) string {
	switch id {
	case EndOfText:
		return "<|endoftext|>"
	case ImStart:
		return "<|im_start|>"
	case ImEnd:
		return "<|im_end|>"
	default:
		return "<|reserved_" + strconv.FormatUint(uint64(id), 10) + "|>"
	}
}

func checkID(i int, id uint32) error {
	if id >= VocabSize {
		return fmt.Errorf("token id %d at position %d is out of vocabulary (vocab size %d)", id, i, VocabSize)
	}
	return nil
}

// Decode turns ids back into text. Special ids become their names
// ("<|im_start|>"), other reserved ids "<|reserved_N|>"; when skipSpecial is
// set, special and reserved ids are dropped. An id >= VocabSize is an error.
// The result is the concatenation of the pieces' bytes, which is invalid
// UTF-8 only if the ids did not come from Encode.
func Decode(ids []uint32, skipSpecial bool) (string, error) {
	buf := make([]byte, 0, len(ids)*maxPiece)
	for i, id := range ids {
		if err := checkID(i, id); err != nil {
			return "", err
		}
		switch {
		case id >= FirstPieceID:
			buf = appendPiece(buf, id)
		case !skipSpecial:
			buf = append(buf, specialName(id)...)
		}
	}
	return string(buf), nil
}

// TokenStrs returns the text piece of each id (for /tokenize
// return_token_strs): the piece's bytes, or the name of a special or
// reserved id. An id >= VocabSize is an error.
func TokenStrs(ids []uint32) ([]string, error) {
	strs := make([]string, len(ids))
	var buf [maxPiece]byte
	for i, id := range ids {
		if err := checkID(i, id); err != nil {
			return nil, err
		}
		if id < FirstPieceID {
			strs[i] = specialName(id)
		} else {
			strs[i] = string(appendPiece(buf[:0], id))
		}
	}
	return strs, nil
}
