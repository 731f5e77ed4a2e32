package inject

import (
	"bytes"
	"fmt"
)

// segment is a stretch of the manifest's text: a document's body, or the
// text between bodies (document markers, comments, blank lines,
// directives), which is always written back as it was read.
type segment struct {
	text []byte
	body bool
	doc  int // for a body: its position among the documents, from 1
	line int // for a body: the line it starts on, from 1
}

// split cuts a manifest into segments on its document boundaries: the
// lines `---` (optionally followed by a comment) and `...` at the start of
// a line. A body starts at its first line that is not blank, a comment or a
// directive, and runs to the next boundary. A `---` followed by content on
// its line is refused, as kubectl refuses it.
//
// The cut needs no YAML parsing: YAML forbids a line starting with `---`
// or `...` and a space inside a document's content.
func split(manifest []byte) ([]segment, error) {
	var segs []segment
	docs := 0
	add := func(text []byte, body bool, line int) {
		if n := len(segs); n > 0 && !body && !segs[n-1].body {
			segs[n-1].text = append(segs[n-1].text, text...)
			return
		}
		s := segment{text: text, body: body}
		if body {
			docs++
			s.doc, s.line = docs, line
		}
		segs = append(segs, s)
	}
	inBody, start, startLine := false, 0, 0
	for off, line := 0, 1; off < len(manifest); line++ {
		end := len(manifest)
		if i := bytes.IndexByte(manifest[off:], '\n'); i >= 0 {
			end = off + i + 1
		}
		l := manifest[off:end]
		switch marker(l) {
		case markerStart, markerEnd:
			if inBody {
				add(manifest[start:off], true, startLine)
				inBody = false
			}
			add(l, false, 0)
		case markerWithContent:
			return nil, fmt.Errorf("line %d: %q: a document separator must stand on its own line (a comment may follow it)", line, bytes.TrimRight(l, "\r\n"))
		default:
			switch {
			case inBody:
			case trivia(l):
				add(l, false, 0)
			default:
				inBody, start, startLine = true, off, line
			}
		}
		off = end
	}
	if inBody {
		add(manifest[start:], true, startLine)
	}
	return segs, nil
}

const (
	markerNone = iota
	markerStart
	markerEnd
	markerWithContent
)

// marker classifies a line as a document marker.
func marker(l []byte) int {
	var rest []byte
	kind := markerNone
	switch {
	case bytes.HasPrefix(l, []byte("---")):
		rest, kind = l[3:], markerStart
	case bytes.HasPrefix(l, []byte("...")):
		rest, kind = l[3:], markerEnd
	default:
		return markerNone
	}
	if len(rest) > 0 && !isSpace(rest[0]) {
		return markerNone // "----", "---x": content, not a marker
	}
	rest = bytes.TrimLeft(rest, " \t\r\n")
	if len(rest) > 0 && rest[0] != '#' {
		return markerWithContent
	}
	return kind
}

// trivia reports whether a line outside a document's body holds no
// content: blank, a comment, or a directive.
func trivia(l []byte) bool {
	t := bytes.TrimLeft(l, " \t\r\n")
	return len(t) == 0 || t[0] == '#' || l[0] == '%'
}

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\r' || b == '\n' }
