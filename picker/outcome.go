package picker

import (
	"bytes"
	"encoding/json"
)

// usage is what an engine reports of a request's prompt: the chat and
// completions form (prompt_tokens, prompt_tokens_details) or the Responses
// form (input_tokens, input_tokens_details). Details is false when the
// engine sent no cached-token details: vLLM omits them when nothing was
// cached, and always without --enable-prompt-tokens-details, so their
// absence is not evidence of a miss.
type usage struct {
	Prompt  int
	Cached  int
	Details bool
	Seen    bool
}

type usageJSON struct {
	PromptTokens        *int `json:"prompt_tokens"`
	InputTokens         *int `json:"input_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

func (u usageJSON) usage() usage {
	out := usage{Seen: true}
	switch {
	case u.PromptTokens != nil:
		out.Prompt = *u.PromptTokens
	case u.InputTokens != nil:
		out.Prompt = *u.InputTokens
	default:
		return usage{}
	}
	switch {
	case u.PromptTokensDetails != nil:
		out.Cached, out.Details = u.PromptTokensDetails.CachedTokens, true
	case u.InputTokensDetails != nil:
		out.Cached, out.Details = u.InputTokensDetails.CachedTokens, true
	}
	return out
}

// usageOf finds the usage in a JSON body or one SSE event's data: at the
// top level (chat, completions, their final stream chunk) or inside
// "response" (a Responses object, response.completed events).
func usageOf(b []byte) usage {
	var v struct {
		Usage    *usageJSON `json:"usage"`
		Response *struct {
			Usage *usageJSON `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(b, &v) != nil {
		return usage{}
	}
	switch {
	case v.Usage != nil:
		return v.Usage.usage()
	case v.Response != nil && v.Response.Usage != nil:
		return v.Response.Usage.usage()
	}
	return usage{}
}

// sniffer watches a response body as it is copied to the client, keeping
// the last usage seen: for SSE, line by line (data: lines mentioning
// usage); for JSON, the whole body up to a bound.
type sniffer struct {
	sse   bool
	limit int
	buf   []byte // SSE: the current partial line; JSON: the body so far
	over  bool   // JSON body beyond limit
	last  usage
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
	if u := usageOf(bytes.TrimSpace(data)); u.Seen {
		s.last = u
	}
}

// result returns the usage found, once the body is complete.
func (s *sniffer) result() usage {
	if !s.sse && !s.over {
		return usageOf(s.buf)
	}
	if s.sse && len(s.buf) > 0 && !s.over {
		s.line(s.buf)
	}
	return s.last
}
