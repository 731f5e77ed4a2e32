package picker

import (
	"encoding/json"
	"testing"
)

// TestWithPriority: the forwarded body's priority is the picker's: set
// when absent (spliced, the rest byte for byte), replacing the client's
// (spelled plainly or escaped, once or twice), in an empty object too; a
// body that is not an object is refused.
func TestWithPriority(t *testing.T) {
	for _, c := range []struct {
		in, want string
	}{
		{`{"prompt":"hi"}`, `{"prompt":"hi","priority":3}`},
		{`{"prompt":"hi"}  ` + "\n", `{"prompt":"hi","priority":3}  ` + "\n"},
		{`{}`, `{"priority":3}`},
		{`{"prompt":"hi","priority":-50}`, `{"prompt":"hi","priority":3}`},
		{`{"priority":1,"prompt":"hi","priority":2}`, `{"prompt":"hi","priority":3}`},
		{`{"pr\u0069ority":9,"prompt":"hi"}`, `{"prompt":"hi","priority":3}`},
		{`{"prompt":"a priority question"}`, `{"prompt":"a priority question","priority":3}`},
	} {
		got, err := withPriority([]byte(c.in), 3)
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %s %v, want %s", c.in, got, err, c.want)
			continue
		}
		var v map[string]any
		if err := json.Unmarshal(got, &v); err != nil || v["priority"] != float64(3) {
			t.Errorf("%s: %s is not an object with priority 3: %v", c.in, got, err)
		}
	}
	for _, bad := range []string{`[1,2]`, `"x"`, ``, `{`} {
		if got, err := withPriority([]byte(bad), 3); err == nil {
			t.Errorf("%q: %s, want an error", bad, got)
		}
	}
	if got := string(withoutPriority([]byte(`{"priority":4,"prompt":"hi"}`))); got != `{"prompt":"hi"}` {
		t.Errorf("without: %s", got)
	}
}
