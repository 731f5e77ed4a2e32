package enginesim

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestTokenIDsFastPath: the hand parser accepts exactly the arrays of
// uint32 that encoding/json accepts, with the same values, or defers.
func TestTokenIDsFastPath(t *testing.T) {
	for _, in := range []string{
		`[1,2,3]`, ` [ 0 , 4294967295 ]`, "[7]\n", `[1]`,
		`[]`, `[01]`, `[-1]`, `[1.5]`, `[1e3]`, `[4294967296]`, `[1,]`, `[,1]`, `[1 2]`, `[1]x`, `["a"]`, `"text"`, `[[1]]`, `[1`, `[`,
		`[99999999999999999999999]`, `[ 1 ,2	,3 ]`,
	} {
		got, ok := tokenIDs(json.RawMessage(in))
		var want []uint32
		err := json.Unmarshal([]byte(in), &want)
		if ok && (err != nil || !slices.Equal(got, want)) {
			t.Errorf("%q: fast path %v, encoding/json %v (%v)", in, got, want, err)
		}
		if !ok && err == nil && len(want) > 0 {
			t.Errorf("%q: fast path deferred a plain id list", in)
		}
	}
}

func FuzzTokenIDs(f *testing.F) {
	f.Add([]byte(`[1, 2 ,3]`))
	f.Add([]byte(`[0]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := tokenIDs(b)
		if !ok {
			return
		}
		var want []uint32
		if err := json.Unmarshal(b, &want); err != nil || !slices.Equal(got, want) {
			t.Fatalf("%q: fast path %v, encoding/json %v (%v)", b, got, want, err)
		}
	})
}
