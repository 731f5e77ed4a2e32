package peers_test

import (
	"testing"

	"github.com/kvroute/kvroute/picker/peers"
)

// TestSGLangResponsesText: SMG's routing text of a /v1/responses body —
// message text parts, simple messages' text and reasoning text, joined
// with single spaces (a separator even for an empty part); no
// function_call arguments, function_call_output outputs, other items or
// parts, and no instructions.
func TestSGLangResponsesText(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		{"string input as is", `{"model":"m","input":"  What now? "}`, "  What now? "},
		{"instructions are not part of it", `{"instructions":"You are a bot.","input":"hi"}`, "hi"},
		{"simple messages, string content", `{"input":[{"role":"user","content":"list"},{"role":"assistant","content":"done"}]}`, "list done"},
		{"function call and its output left out",
			`{"input":[{"role":"user","content":"list"},{"type":"function_call","call_id":"c","name":"ls","arguments":"{\"d\":1}"},` +
				`{"type":"function_call_output","call_id":"c","output":"a.txt b.txt"},{"role":"assistant","content":[{"type":"output_text","text":"done"}]}]}`,
			"list done"},
		{"typed message parts: input_text and output_text only",
			`{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"},` +
				`{"type":"input_file","file_id":"f"},{"type":"input_text","text":"b"}]},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"c"},{"type":"refusal","refusal":"no"}]}]}`,
			"a b c"},
		{"typed message with string content", `{"input":[{"type":"message","role":"user","content":"plain"}]}`, "plain"},
		{"reasoning text counts, its summary does not",
			`{"input":[{"role":"user","content":"q"},{"type":"reasoning","id":"r","summary":[{"type":"summary_text","text":"S"}],` +
				`"content":[{"type":"reasoning_text","text":"think"}]},{"role":"assistant","content":"a"}]}`,
			"q think a"},
		{"an empty part still takes a separator", `{"input":[{"role":"user","content":""},{"role":"user","content":"x"},{"role":"user","content":[{"type":"input_text","text":""}]}]}`, " x "},
		{"other items contribute nothing",
			`{"input":[{"type":"item_reference","id":"i"},{"type":"mcp_call","id":"m","arguments":"{}","output":"o"},` +
				`{"type":"local_shell_call_output","id":"l","output":"ls"},{"role":"user","content":"only"}]}`,
			"only"},
		{"no input", `{"model":"m"}`, ""},
		{"not JSON", `{"input":`, ""},
		{"empty list", `{"input":[]}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := peers.SGLangResponsesText([]byte(tc.body)); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
