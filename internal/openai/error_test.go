package openai

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestErrorOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want APIError
		ok   bool
	}{
		{"picker", `{"error":{"message":"bad token","type":"invalid_request_error","param":null,"code":"unauthorized"}}`,
			APIError{Message: "bad token", Type: "invalid_request_error", Code: "unauthorized"}, true},
		{"vLLM, numeric code", `{"error":{"message":"The model does not exist.","type":"NotFoundError","param":"model","code":404}}`,
			APIError{Message: "The model does not exist.", Type: "NotFoundError", Param: "model", Code: "404"}, true},
		{"message only", `{"error":{"message":"Not Found"}}`, APIError{Message: "Not Found"}, true},
		{"code of another type", `{"error":{"message":"m","code":{"x":1}}}`, APIError{Message: "m"}, true},
		{"framework error", `{"detail":"Not Found"}`, APIError{}, false},
		{"null error", `{"error":null}`, APIError{}, false},
		{"text", `404 page not found`, APIError{}, false},
		{"empty", ``, APIError{}, false},
	} {
		got, ok := ErrorOf([]byte(tc.body))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %+v %v, want %+v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestStatusError(t *testing.T) {
	body := []byte("  {\"error\":{\"message\":\"no\",\"type\":\"invalid_request_error\"}}\n")
	for _, tc := range []struct {
		err  *StatusError
		want string
	}{
		{NewStatusError("http://e/v1/completions", 400, body), `http://e/v1/completions: status 400: {"error":{"message":"no","type":"invalid_request_error"}}`},
		{NewStatusError("", 401, body), `status 401: {"error":{"message":"no","type":"invalid_request_error"}}`},
		{NewStatusError("http://s/debug/state", 404, nil), `http://s/debug/state: status 404`},
		{NewStatusError("", 503, []byte(" \n")), `status 503`},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
	e := NewStatusError("", 401, body)
	if e.Status != 401 || e.Message != "no" || e.Type != "invalid_request_error" {
		t.Fatalf("%+v", e)
	}
	// Wrapped, it is still found by type.
	var se *StatusError
	if err := fmt.Errorf("decision API: %w", e); !errors.As(err, &se) || se.Status != 401 {
		t.Fatalf("errors.As: %v", err)
	}
	// Long bodies are cut at BodyExcerpt characters, not bytes.
	long := NewStatusError("", 500, []byte(strings.Repeat("é", 2*BodyExcerpt)))
	if n := len([]rune(long.Body)); n != BodyExcerpt {
		t.Fatalf("excerpt of %d characters", n)
	}
}
