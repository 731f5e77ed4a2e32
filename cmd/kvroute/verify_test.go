package main

import (
	"bytes"
	"testing"

	"github.com/kvroute/kvroute/internal/verify"
)

// TestPrintVerify pins the human report: the groups with their values in
// key order, a line per check (with its figure, when it has one), the
// failures with their causes, the count.
func TestPrintVerify(t *testing.T) {
	rep := verify.Report{
		Picker: "http://127.0.0.1:36429",
		Groups: []verify.Group{{Model: "m", Endpoints: []string{"http://a", "http://b"}, Values: map[string]string{"key_format": "k1", "block_size": "16"}}},
		Fleet:  []verify.Endpoint{{Endpoint: "http://a"}, {Endpoint: "http://b"}},
		Checks: []verify.Check{
			{Name: "identity block_size", Endpoint: "http://a", OK: true, Detail: "fine"},
			{Name: "probe chat tokens", Endpoint: "http://b", Detail: "the first 0 agree", Cause: "another template"},
			{Name: "probe chat", Detail: "first send: status 500", Cause: "the probe could not complete"},
			{Name: "probe lag", Endpoint: "http://a", OK: true, Detail: "predicted 23 ms after", Figure: "23 ms"},
			{Name: "probe lag", Endpoint: "http://b", Detail: "never predicted in 5.0 s", Cause: "no live events", Figure: "never predicted"},
		},
	}
	want := `kvroute verify: picker http://127.0.0.1:36429, 2 endpoint(s)

identity groups:
  m: 2 endpoint(s); block_size=16, key_format=k1

✔ identity block_size                      http://a
✘ probe chat tokens                        http://b
✘ probe chat                               
✔ probe lag                                http://a  23 ms
✘ probe lag                                http://b  never predicted

failures:
✘ probe chat tokens http://b
    the first 0 agree
    likely cause: another template
✘ probe chat 
    first send: status 500
    likely cause: the probe could not complete
✘ probe lag http://b
    never predicted in 5.0 s
    likely cause: no live events

5 checks, 2 passed, 3 failed
`
	var b bytes.Buffer
	printVerify(&b, &rep)
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}
