package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// APIError is the error object of an OpenAI error body:
// {"error": {"message", "type", "param", "code"}}.
type APIError struct {
	Message string
	Type    string // "invalid_request_error", "BadRequestError", …
	Param   string // the offending field, if named
	Code    string // a machine-readable code; vLLM sends the status number
}

// ErrorOf reads the OpenAI error object in body; false when body holds
// none.
func ErrorOf(body []byte) (APIError, bool) {
	var v struct {
		Error *struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Param   *string         `json:"param"`
			Code    json.RawMessage `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil || v.Error == nil {
		return APIError{}, false
	}
	e := APIError{Message: v.Error.Message, Type: v.Error.Type, Code: scalar(v.Error.Code)}
	if v.Error.Param != nil {
		e.Param = *v.Error.Param
	}
	return e, true
}

// scalar is a JSON string's value or a number's text ("" for null, or
// anything else).
func scalar(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// BodyExcerpt is how many characters of an error body a StatusError
// keeps for its message.
const BodyExcerpt = 300

// StatusError is an answer with a status other than the one wanted.
type StatusError struct {
	URL    string // the request's URL; "" when the caller's message names it
	Status int
	// APIError is the body's OpenAI error object (zero when it has none).
	APIError
	// Body is the body, space trimmed, cut at BodyExcerpt characters.
	Body string
}

// NewStatusError is the error of an answer with status and body to a
// request to url ("" to leave it out of the message).
func NewStatusError(url string, status int, body []byte) *StatusError {
	e := &StatusError{URL: url, Status: status}
	e.APIError, _ = ErrorOf(body)
	e.Body = fmt.Sprintf("%.*s", BodyExcerpt, bytes.TrimSpace(body))
	return e
}

// Error reads "[url: ]status N[: body]".
func (e *StatusError) Error() string {
	msg := "status " + strconv.Itoa(e.Status)
	if e.URL != "" {
		msg = e.URL + ": " + msg
	}
	if e.Body != "" {
		msg = fmt.Sprintf("%s: %s", msg, e.Body)
	}
	return msg
}
