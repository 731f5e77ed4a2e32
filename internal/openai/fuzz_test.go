package openai

import (
	"encoding/json"
	"testing"
)

// FuzzUsageOf: any bytes decode without panicking; UsageOf is DecodeUsage
// without the error; a usage seen re-encodes, in its own form, to itself.
func FuzzUsageOf(f *testing.F) {
	for _, s := range []string{
		`{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":96}}}`,
		`{"response":{"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":48}}}}`,
		`{"usage":{"input_tokens":8,"prompt_tokens":7}}`,
		`{"usage":null}`, `[DONE]`, ``, `{"usage":{"prompt_tokens":1e3}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u := UsageOf(b)
		d, err := DecodeUsage(b)
		if d != u || (err != nil && u != (Usage{})) {
			t.Fatalf("UsageOf %+v, DecodeUsage %+v %v", u, d, err)
		}
		if !u.Seen {
			if u != (Usage{}) {
				t.Fatalf("unseen usage with values: %+v", u)
			}
			return
		}
		if !u.Details && u.Cached != 0 {
			t.Fatalf("cached tokens without details: %+v", u)
		}
		w := map[string]any{"prompt_tokens": u.Prompt}
		if u.Details {
			w["prompt_tokens_details"] = map[string]any{"cached_tokens": u.Cached}
		}
		again, _ := json.Marshal(map[string]any{"usage": w})
		if back := UsageOf(again); back != u {
			t.Fatalf("%+v re-encoded as %s gives %+v", u, again, back)
		}
	})
}

// FuzzErrorOf: any bytes, as an error body, give a StatusError without
// panicking, whose message holds the status.
func FuzzErrorOf(f *testing.F) {
	f.Add([]byte(`{"error":{"message":"m","type":"t","param":"p","code":400}}`))
	f.Add([]byte(`{"error":{"code":"x"}}`))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e := NewStatusError("u", 418, b)
		if msg := e.Error(); len(msg) < len("u: status 418") || msg[:len("u: status 418")] != "u: status 418" {
			t.Fatalf("%q", msg)
		}
		a, ok := ErrorOf(b)
		if e.APIError != a || (!ok && a != APIError{}) {
			t.Fatalf("ErrorOf %+v %v, StatusError's %+v", a, ok, e.APIError)
		}
	})
}
