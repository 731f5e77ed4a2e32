package picker

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/picker/intake"
)

// TestOutputWatch: the chunk at which FirstToken is called. A Responses
// stream's opening events (created, in_progress, queued, and the
// output_item/content_part openers) are passed over, named by event:
// lines or, without them, by their data's type, lines split across
// chunks included; any other answer fires at its first byte; it fires
// once.
func TestOutputWatch(t *testing.T) {
	ev := func(typ string) string { return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"}\n\n" }
	data := func(typ string) string { return "data: {\"sequence_number\":1,\"type\":\"" + typ + "\"}\n\n" }
	open := ev("response.created") + ev("response.in_progress")
	cases := []struct {
		name   string
		kind   intake.Kind
		sse    bool
		chunks []string
		fires  int // the chunk it fires at; -1 never
	}{
		{"chat stream: the first chunk", intake.Chat, true, []string{"data: {\"choices\":[]}\n\n", "data: [DONE]\n\n"}, 0},
		{"completions stream: the first chunk", intake.Completion, true, []string{"data: {}\n\n"}, 0},
		{"a whole answer: its first byte", intake.Responses, false, []string{"{", "}"}, 0},
		{"empty chunks do not count", intake.Chat, true, []string{"", "data: x\n"}, 1},
		{"responses: past created and in_progress", intake.Responses, true,
			[]string{ev("response.created"), ev("response.in_progress"), ev("response.output_text.delta")}, 2},
		{"responses: the openers the simulated engine sends at once", intake.Responses, true,
			[]string{open + ev("response.output_item.added") + ev("response.content_part.added"), ev("response.output_text.delta")}, 1},
		{"responses: the delta in the chunk of the openers", intake.Responses, true,
			[]string{open + ev("response.output_item.added") + ev("response.output_text.delta")}, 0},
		{"responses: an event line cut across chunks", intake.Responses, true,
			[]string{open + "event: response.outp", "ut_text.delta\ndata: {}\n\n"}, 1},
		{"responses: an opener's line cut across chunks", intake.Responses, true,
			[]string{"event: response.cre", "ated\ndata: {}\n\n", ev("response.queued"), ev("response.reasoning_text.delta")}, 3},
		{"responses: no event lines, the data's type", intake.Responses, true,
			[]string{data("response.created") + data("response.in_progress"), data("response.output_text.delta")}, 1},
		{"responses: a data line cut across chunks", intake.Responses, true,
			[]string{data("response.created") + "data: {\"type\":\"response.in_", "progress\"}\n\n", data("response.function_call_arguments.delta")}, 2},
		{"responses: a terminal event with no output", intake.Responses, true, []string{open, ev("response.failed")}, 1},
		{"responses: an error event", intake.Responses, true, []string{open + "event: error\ndata: {}\n\n"}, 0},
		{"responses: comments and CRLF", intake.Responses, true,
			[]string{": keep-alive\r\n\r\nevent: response.created\r\ndata: {}\r\n\r\n", "event: response.output_text.delta\r\n"}, 1},
		{"responses: only openers", intake.Responses, true, []string{open, ev("response.content_part.added")}, -1},
		{"responses: once", intake.Responses, true, []string{ev("response.output_text.delta"), ev("response.output_text.delta")}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newOutputWatch(tc.kind, tc.sse)
			got := -1
			for i, c := range tc.chunks {
				if w.see([]byte(c)) {
					if got >= 0 {
						t.Fatalf("fired at chunks %d and %d", got, i)
					}
					got = i
				}
			}
			if got != tc.fires {
				t.Fatalf("fired at chunk %d, want %d", got, tc.fires)
			}
		})
	}
	// A line past the bound is skipped, not held: the next line counts.
	w := newOutputWatch(intake.Responses, true)
	long := "data: {\"type\":\"response.output_text.delta\",\"pad\":\"" + strings.Repeat("x", outputLineLimit) + "\"}"
	if w.see([]byte(ev("response.created")+"data: ")) || w.see([]byte(long[6:])) || len(w.line) != 0 {
		t.Fatal("an over-long line was held or read")
	}
	if w.see([]byte("\n\n")) || !w.see([]byte(ev("response.output_text.delta"))) {
		t.Fatal("the stream after an over-long line is not read")
	}
}
