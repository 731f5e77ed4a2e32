package chat

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestVocabSize(t *testing.T) {
	if VocabSize != 16844008 {
		t.Fatalf("VocabSize = %d, want 16844008", VocabSize)
	}
}

// Golden ids computed by hand from the rule, so that the tokenizer cannot
// change silently.
func TestEncodeGolden(t *testing.T) {
	tests := []struct {
		text string
		want []uint32
	}{
		{"", nil},
		// "Hel" "lo" " wo" "rld"
		{"Hello world", []uint32{4811348, 29015, 2194519, 7565644}},
		// "a" " " " b" "\n\n\t" "c" "!" "?"
		{"a  b\n\n\tc!?", []uint32{1097, 1032, 9546, 724721, 1099, 1033, 1063}},
		// "h\xc3\xa9" "llo"
		{"héllo", []uint32{6932625, 7172439}},
		// "<" "|" "im" "_" "sta" "rt" "|" ">"
		{"<|im_start|>", []uint32{1060, 1124, 28245, 1095, 7633225, 30556, 1124, 1062}},
		// "\n" " x"
		{"\n x", []uint32{1010, 9568}},
		// "   " " a"
		{"    a", []uint32{2172168, 9545}},
		// "\x00"
		{"\x00", []uint32{FirstPieceID}},
		// "\xff\xff\xff"
		{"\xff\xff\xff", []uint32{VocabSize - 1}},
	}
	for _, tt := range tests {
		if got := Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

// TestEncodePieces checks the piece boundaries of the rule.
func TestEncodePieces(t *testing.T) {
	tests := []struct {
		text string
		want []string
	}{
		{"hello", []string{"hel", "lo"}},
		{" hello", []string{" he", "llo"}},
		{"a b", []string{"a", " b"}},
		{"a\tb", []string{"a", "\t", "b"}},
		{"a\nb", []string{"a", "\n", "b"}},
		{"a\n b", []string{"a", "\n", " b"}},
		{"a \n b", []string{"a", " \n", " b"}},
		{"a   ", []string{"a", "   "}},
		{"a    ", []string{"a", "   ", " "}},
		{"  ", []string{"  "}},
		{" ", []string{" "}},
		{" !", []string{" ", "!"}},
		{"x,y", []string{"x", ",", "y"}},
		{"a1B2c3d", []string{"a1B", "2c3", "d"}},
		{"日本", []string{"日", "本"}},
		{" 日本", []string{" \xe6\x97", "\xa5\xe6\x9c", "\xac"}},
		{"\r\n\r\n", []string{"\r\n\r", "\n"}},
		{"<|im_end|>", []string{"<", "|", "im", "_", "end", "|", ">"}},
	}
	for _, tt := range tests {
		got, err := TokenStrs(Encode(tt.text))
		if err != nil {
			t.Fatalf("TokenStrs(Encode(%q)): %v", tt.text, err)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("pieces of %q = %q, want %q", tt.text, got, tt.want)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	tests := []string{
		"",
		" ",
		"\n",
		"Hello, world!\n",
		"  leading and trailing  ",
		"tabs\tand\r\nnewlines\n\n\n\n",
		"héllo wörld 日本語 🎉",
		"\xff\xfe invalid \xc3 utf8",
		"<|im_start|>user\nhi<|im_end|>",
		"\x00\x01\x7f",
		strings.Repeat("abcdefg ", 100),
		`{"name": "get_weather", "arguments": {"city": "Paris"}}`,
	}
	for _, s := range tests {
		ids := Encode(s)
		got, err := Decode(ids, false)
		if err != nil {
			t.Fatalf("Decode(Encode(%q)): %v", s, err)
		}
		if got != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, got)
		}
		if got, _ := Decode(ids, true); got != s {
			t.Errorf("Decode(Encode(%q), skipSpecial) = %q", s, got)
		}
		if len(ids) > len(s) {
			t.Errorf("len(Encode(%q)) = %d > %d bytes", s, len(ids), len(s))
		}
	}
}

func TestAppendEncode(t *testing.T) {
	dst := []uint32{ImStart}
	got := AppendEncode(dst, "hi there")
	want := append([]uint32{ImStart}, Encode("hi there")...)
	if !slices.Equal(got, want) {
		t.Errorf("AppendEncode = %v, want %v", got, want)
	}
}

func TestDecodeSpecial(t *testing.T) {
	ids := []uint32{ImStart}
	ids = AppendEncode(ids, "hi")
	ids = append(ids, ImEnd, EndOfText, 0, 4, FirstPieceID-1)
	got, err := Decode(ids, false)
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>hi<|im_end|><|endoftext|><|reserved_0|><|reserved_4|><|reserved_999|>"
	if got != want {
		t.Errorf("Decode = %q, want %q", got, want)
	}
	got, err = Decode(ids, true)
	if err != nil {
		t.Fatal(err)
	}
	if got != "hi" {
		t.Errorf("Decode(skipSpecial) = %q, want %q", got, "hi")
	}

	strs, err := TokenStrs([]uint32{ImStart, 7, Encode("a")[0], Encode(" ab")[0], VocabSize - 1})
	if err != nil {
		t.Fatal(err)
	}
	wantStrs := []string{"<|im_start|>", "<|reserved_7|>", "a", " ab", "\xff\xff\xff"}
	if !slices.Equal(strs, wantStrs) {
		t.Errorf("TokenStrs = %q, want %q", strs, wantStrs)
	}
}

func TestDecodeOutOfVocab(t *testing.T) {
	for _, id := range []uint32{VocabSize, VocabSize + 1, math.MaxUint32} {
		ids := []uint32{ImStart, id}
		if _, err := Decode(ids, false); err == nil {
			t.Errorf("Decode(%d) succeeded, want error", id)
		}
		if _, err := Decode(ids, true); err == nil {
			t.Errorf("Decode(%d, skipSpecial) succeeded, want error", id)
		}
		if _, err := TokenStrs(ids); err == nil {
			t.Errorf("TokenStrs(%d) succeeded, want error", id)
		}
	}
}

// TestPieceBijection checks the boundaries of the three id ranges.
func TestPieceBijection(t *testing.T) {
	pieces := []string{"\x00", "\xff", "\x00\x00", "\xff\xff", "\x00\x00\x00", "\xff\xff\xff", "ab", "abc"}
	seen := map[uint32]string{}
	for _, p := range pieces {
		id := pieceID(p)
		if id < FirstPieceID || id >= VocabSize {
			t.Errorf("pieceID(%q) = %d out of range", p, id)
		}
		if q, ok := seen[id]; ok {
			t.Errorf("pieceID(%q) = pieceID(%q) = %d", p, q, id)
		}
		seen[id] = p
		if got := string(appendPiece(nil, id)); got != p {
			t.Errorf("appendPiece(pieceID(%q)) = %q", p, got)
		}
	}
	if got := pieceID("\xff") + 1; got != pieceID("\x00\x00") {
		t.Errorf("1-byte and 2-byte ranges are not contiguous")
	}
	if got := pieceID("\xff\xff") + 1; got != pieceID("\x00\x00\x00") {
		t.Errorf("2-byte and 3-byte ranges are not contiguous")
	}
}

func FuzzTokenizer(f *testing.F) {
	for _, s := range []string{"", "Hello world", "a  b\n\n\tc!?", "héllo", " \n \t x", "\xff\xfe", "<|im_end|>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids := Encode(s)
		if len(ids) > len(s) {
			t.Fatalf("len(Encode(%q)) = %d > %d", s, len(ids), len(s))
		}
		for _, id := range ids {
			if id < FirstPieceID || id >= VocabSize {
				t.Fatalf("Encode(%q) has id %d out of range", s, id)
			}
		}
		got, err := Decode(ids, false)
		if err != nil {
			t.Fatalf("Decode(Encode(%q)): %v", s, err)
		}
		if got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
		strs, err := TokenStrs(ids)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(strs, "") != s {
			t.Fatalf("TokenStrs(Encode(%q)) = %q", s, strs)
		}
		for _, p := range strs {
			if !wellFormedPiece(p) {
				t.Fatalf("Encode(%q) has ill-formed piece %q", s, p)
			}
		}
	})
}

// wellFormedPiece reports whether p is a piece the rule can produce: one
// byte, whitespace only, or word bytes with at most one leading space.
func wellFormedPiece(p string) bool {
	if len(p) < 1 || len(p) > 3 {
		return false
	}
	if len(p) == 1 {
		return true
	}
	allSpace := true
	for i := 0; i < len(p); i++ {
		allSpace = allSpace && isSpace(p[i])
	}
	if allSpace {
		return true
	}
	w := strings.TrimPrefix(p, " ")
	for i := 0; i < len(w); i++ {
		if !isWord(w[i]) {
			return false
		}
	}
	return true
}
