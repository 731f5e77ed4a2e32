package picker

import (
	"bytes"
	"encoding/json"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/picker/intake"
)

// sniffer watches a response body as it is copied to the client. It keeps
// the last usage seen (openai.UsageOf: the engine's prompt accounting, with
// its cached tokens): for SSE, line by line (data: lines mentioning usage);
// for JSON, the whole body up to a bound. For SSE it also follows the
// events, to tell whether the answer's final one arrived (complete).
type sniffer struct {
	sse   bool
	kind  intake.Kind // the API answered: which SSE event is final
	limit int
	buf   []byte // SSE: the current partial line; JSON: the body so far
	over  bool   // JSON body beyond limit; SSE: the current line is
	last  openai.Usage

	// SSE events: the one being read, and whether a final one was
	// dispatched (ended by its blank line, as the SSE format and the
	// clients' decoders have it).
	named bool // the event has an event: line
	final bool // the event is its answer's last
	ended bool
}

var (
	usageKey = []byte(`"usage"`)
	typeKey  = []byte(`"type"`)
	doneData = []byte("[DONE]")
)

func (s *sniffer) Write(p []byte) (int, error) {
	if !s.sse {
		if !s.over {
			if len(s.buf)+len(p) > s.limit {
				s.over, s.buf = true, nil
			} else {
				s.buf = append(s.buf, p...)
			}
		}
		return len(p), nil
	}
	rest := p
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			if !s.over && len(s.buf)+len(rest) <= s.limit {
				s.buf = append(s.buf, rest...)
			} else {
				s.buf = s.buf[:0] // a line longer than the bound: not ours to parse
				s.over = true
			}
			break
		}
		line := rest[:i]
		switch {
		case s.over:
			// A line past the bound (a data line: an event: line is short)
			// is skipped; its event's name, read before, still counts.
		case len(s.buf) > 0:
			s.line(append(s.buf, line...))
		default:
			s.line(line)
		}
		s.buf, s.over = s.buf[:0], false
		rest = rest[i+1:]
	}
	return len(p), nil
}

// line reads one SSE line (without its newline).
func (s *sniffer) line(l []byte) {
	l = bytes.TrimRight(l, "\r")
	if len(l) == 0 { // a blank line dispatches the event
		s.ended = s.ended || s.final
		s.named, s.final = false, false
		return
	}
	name, value, _ := bytes.Cut(l, []byte(":"))
	value = bytes.TrimPrefix(value, []byte(" "))
	switch string(name) {
	case "event":
		s.named = true
		s.final = s.final || s.kind == intake.Responses && finalResponsesEvent(value)
	case "data":
		data := bytes.TrimSpace(value)
		switch {
		case bytes.Equal(data, doneData):
			s.final = true
		case s.kind == intake.Responses && !s.named && bytes.Contains(data, typeKey):
			// No event: line (vLLM and OpenAI send one): the type is in
			// the data.
			var ev struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(data, &ev) == nil && finalResponsesEvent([]byte(ev.Type)) {
				s.final = true
			}
		}
		s.usage(data)
	}
}

// finalResponsesEvent reports whether a Responses stream ends with an
// event of type t: response.completed, or the terminal response.failed and
// response.incomplete; vLLM ends a stream that failed in generation with
// an error event.
func finalResponsesEvent(t []byte) bool {
	switch string(t) {
	case "response.completed", "response.failed", "response.incomplete", "error":
		return true
	}
	return false
}

func (s *sniffer) usage(data []byte) {
	if !bytes.Contains(data, usageKey) {
		return
	}
	if u := openai.UsageOf(data); u.Seen {
		s.last = u
	}
}

// complete reports whether the body seen is a whole answer, given that it
// was read to its end: an SSE answer when its API's final event arrived
// (data: [DONE] for chat and completions; response.completed, or a
// terminal response.failed, response.incomplete or error event, for
// Responses; data: [DONE] ends any stream); a JSON answer always, since its
// framing (Content-Length or the last chunk) says where it ends and the
// transport reports a body cut short as a read error.
func (s *sniffer) complete() bool {
	return !s.sse || s.ended
}

// result returns the usage found, once the body is complete.
func (s *sniffer) result() openai.Usage {
	if !s.sse && !s.over {
		return openai.UsageOf(s.buf)
	}
	if s.sse && len(s.buf) > 0 && !s.over { // a last line without its newline
		if data, ok := bytes.CutPrefix(bytes.TrimRight(s.buf, "\r"), []byte("data:")); ok {
			s.usage(bytes.TrimSpace(data))
		}
	}
	return s.last
}
