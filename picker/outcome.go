package picker

import (
	"bytes"

	"github.com/kvroute/kvroute/internal/openai"
)

// sniffer watches a response body as it is copied to the client, keeping
// the last usage seen (openai.UsageOf: the engine's prompt accounting, with
// its cached tokens): for SSE, line by line (data: lines mentioning usage);
// for JSON, the whole body up to a bound.
type sniffer struct {
	sse   bool
	limit int
	buf   []byte // SSE: the current partial line; JSON: the body so far
	over  bool   // JSON body beyond limit
	last  openai.Usage
}

var usageKey = []byte(`"usage"`)

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
			if len(s.buf)+len(rest) <= s.limit {
				s.buf = append(s.buf, rest...)
			} else {
				s.buf = s.buf[:0] // a line longer than the bound: not ours to parse
				s.over = true
			}
			break
		}
		line := rest[:i]
		if len(s.buf) > 0 || s.over {
			if !s.over {
				line = append(s.buf, line...)
			} else {
				line = nil
			}
			s.buf, s.over = s.buf[:0], false
		}
		s.line(line)
		rest = rest[i+1:]
	}
	return len(p), nil
}

func (s *sniffer) line(l []byte) {
	l = bytes.TrimRight(l, "\r")
	data, ok := bytes.CutPrefix(l, []byte("data:"))
	if !ok || !bytes.Contains(data, usageKey) {
		return
	}
	if u := openai.UsageOf(bytes.TrimSpace(data)); u.Seen {
		s.last = u
	}
}

// result returns the usage found, once the body is complete.
func (s *sniffer) result() openai.Usage {
	if !s.sse && !s.over {
		return openai.UsageOf(s.buf)
	}
	if s.sse && len(s.buf) > 0 && !s.over {
		s.line(s.buf)
	}
	return s.last
}
