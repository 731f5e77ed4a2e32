package intake

import (
	"strings"

	"github.com/valyala/fastjson"
)

// Text is a body's text as a character-level router reads it (SGLang's
// model gateway in HTTP mode, a peer policy kvroute compares against): a
// text prompt as sent (an array of them joined with spaces), or the chat
// messages' — or Responses input items' — text contents joined with
// single spaces: string contents, the text of text parts, function call
// arguments and outputs. Token prompts have no text: "". A body that does
// not parse gives "" (Parse reports it). kind may be Any.
func Text(kind Kind, body []byte) string {
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil || v.Type() != fastjson.TypeObject {
		return ""
	}
	if kind == Any {
		if kind, err = kindOf(v); err != nil {
			return ""
		}
	}
	var parts []string
	add := func(s string) {
		if s != "" {
			parts = append(parts, s)
		}
	}
	switch kind {
	case Completion:
		prompt := v.Get("prompt")
		if s, ok := str(prompt); ok {
			add(s)
		}
		for _, x := range arrayOf(prompt) {
			if s, ok := str(x); ok {
				add(s)
			}
		}
	case Chat:
		for _, m := range arrayOf(v.Get("messages")) {
			contentText(m.Get("content"), add)
		}
	case Responses:
		input := v.Get("input")
		if s, ok := str(input); ok {
			add(s)
		}
		for _, item := range arrayOf(input) {
			contentText(item.Get("content"), add)
			for _, f := range []string{"arguments", "output"} {
				if s, ok := str(item.Get(f)); ok {
					add(s)
				}
			}
		}
	}
	return strings.Join(parts, " ")
}

// contentText adds a message's content: a string, or its parts' text.
func contentText(c *fastjson.Value, add func(string)) {
	if s, ok := str(c); ok {
		add(s)
		return
	}
	for _, part := range arrayOf(c) {
		if s, ok := str(part.Get("text")); ok {
			add(s)
		}
	}
}

// str is v's string, when v is one.
func str(v *fastjson.Value) (string, bool) {
	if v == nil || v.Type() != fastjson.TypeString {
		return "", false
	}
	b, _ := v.StringBytes()
	return string(b), true
}

// arrayOf is v's elements, none when v is not an array.
func arrayOf(v *fastjson.Value) []*fastjson.Value {
	if v == nil || v.Type() != fastjson.TypeArray {
		return nil
	}
	a, _ := v.Array()
	return a
}
