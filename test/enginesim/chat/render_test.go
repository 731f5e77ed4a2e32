package chat

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// seq builds a token sequence from segments: a uint32 is a token, a string
// is encoded on its own.
func seq(segments ...any) []uint32 {
	var ids []uint32
	for _, s := range segments {
		switch s := s.(type) {
		case uint32:
			ids = append(ids, s)
		case string:
			ids = AppendEncode(ids, s)
		default:
			panic(fmt.Sprintf("seq: bad segment %T", s))
		}
	}
	return ids
}

func mustRender(t *testing.T, msgs []Message, tools []Tool, opts RenderOptions) []uint32 {
	t.Helper()
	ids, err := Render(msgs, tools, opts)
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	return ids
}

// checkRender checks both the exact tokens and, for readability, the text.
func checkRender(t *testing.T, got, want []uint32, wantText string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("tokens\n got  %v\n want %v", got, want)
	}
	text, err := Decode(got, false)
	if err != nil {
		t.Fatal(err)
	}
	if text != wantText {
		t.Errorf("text\n got  %q\n want %q", text, wantText)
	}
}

func TestRenderConversation(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "Hi there"},
		{Role: "assistant", Content: "Hello! "},
		{Role: "user", Content: "\nHow are you?"},
	}
	got := mustRender(t, msgs, nil, RenderOptions{AddGenerationPrompt: true})
	want := seq(
		ImStart, "system", "\n", "Be brief.", ImEnd, "\n",
		ImStart, "user", "\n", "Hi there", ImEnd, "\n",
		ImStart, "assistant", "\n", "Hello! ", ImEnd, "\n",
		ImStart, "user", "\n", "\nHow are you?", ImEnd, "\n",
		ImStart, "assistant", "\n",
	)
	checkRender(t, got, want, "<|im_start|>system\nBe brief.<|im_end|>\n"+
		"<|im_start|>user\nHi there<|im_end|>\n"+
		"<|im_start|>assistant\nHello! <|im_end|>\n"+
		"<|im_start|>user\n\nHow are you?<|im_end|>\n"+
		"<|im_start|>assistant\n")

	// Segments are tokenized separately: "\n" + "\nHow" is not "\n\n" + "How".
	if slices.Equal(got, seq(ImStart, "system", "\n", "Be brief.", ImEnd, "\n",
		ImStart, "user", "\n", "Hi there", ImEnd, "\n",
		ImStart, "assistant", "\n", "Hello! ", ImEnd, "\n",
		ImStart, "user", "\n\nHow are you?", ImEnd, "\n",
		ImStart, "assistant", "\n")) {
		t.Error("segments were merged")
	}

	got = mustRender(t, msgs, nil, RenderOptions{})
	genPrompt := seq(ImStart, "assistant", "\n")
	checkRender(t, got, want[:len(want)-len(genPrompt)], "<|im_start|>system\nBe brief.<|im_end|>\n"+
		"<|im_start|>user\nHi there<|im_end|>\n"+
		"<|im_start|>assistant\nHello! <|im_end|>\n"+
		"<|im_start|>user\n\nHow are you?<|im_end|>\n")
}

func TestRenderDeveloperAsSystem(t *testing.T) {
	msgs := []Message{{Role: "developer", Content: "Rules."}, {Role: "user", Content: "x"}}
	got := mustRender(t, msgs, nil, RenderOptions{})
	want := seq(ImStart, "system", "\n", "Rules.", ImEnd, "\n", ImStart, "user", "\n", "x", ImEnd, "\n")
	checkRender(t, got, want, "<|im_start|>system\nRules.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n")
}

func TestRenderTools(t *testing.T) {
	tools := []Tool{
		{Name: "get_weather", Description: "Get <the> weather & more.", Parameters: json.RawMessage(`{ "type": "object",
			"properties": {"city": {"type": "string"}} }`)},
		{Name: "noop"},
	}
	line1 := `{"type":"function","function":{"name":"get_weather","description":"Get <the> weather & more.","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}`
	line2 := `{"type":"function","function":{"name":"noop"}}`

	t.Run("developer consumed", func(t *testing.T) {
		msgs := []Message{{Role: "developer", Content: "Rules."}, {Role: "user", Content: "Weather?"}}
		got := mustRender(t, msgs, tools, RenderOptions{AddGenerationPrompt: true})
		want := seq(
			ImStart, "system", "\n", "Rules.", "\n\n", "# Tools\n", line1, "\n", line2, "\n", ImEnd, "\n",
			ImStart, "user", "\n", "Weather?", ImEnd, "\n",
			ImStart, "assistant", "\n",
		)
		checkRender(t, got, want, "<|im_start|>system\nRules.\n\n# Tools\n"+line1+"\n"+line2+"\n<|im_end|>\n"+
			"<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n")
	})

	t.Run("no system message", func(t *testing.T) {
		msgs := []Message{{Role: "user", Content: "Weather?"}}
		got := mustRender(t, msgs, tools[1:], RenderOptions{})
		want := seq(
			ImStart, "system", "\n", "# Tools\n", line2, "\n", ImEnd, "\n",
			ImStart, "user", "\n", "Weather?", ImEnd, "\n",
		)
		checkRender(t, got, want, "<|im_start|>system\n# Tools\n"+line2+"\n<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n")
	})

	t.Run("invalid parameters", func(t *testing.T) {
		bad := []Tool{{Name: "f", Parameters: json.RawMessage(`{`)}}
		if _, err := Render([]Message{{Role: "user"}}, bad, RenderOptions{}); err == nil {
			t.Error("Render succeeded with invalid parameters")
		}
	})
}

func TestRenderToolCalls(t *testing.T) {
	msgs := []Message{
		{Role: "user", Content: "Paris?"},
		{Role: "assistant", Content: "Let me check.", ToolCalls: []ToolCall{
			{ID: "c1", Name: "get_weather", Arguments: `{"city": "Paris"}`},
			{ID: "c2", Name: `say "hi"`},
		}},
		{Role: "tool", ToolCallID: "c1", Content: "sunny"},
		{Role: "assistant", Content: "Sunny."},
	}
	got := mustRender(t, msgs, nil, RenderOptions{})
	call1 := `{"name": "get_weather", "arguments": {"city": "Paris"}}`
	call2 := `{"name": "say \"hi\"", "arguments": {}}`
	want := seq(
		ImStart, "user", "\n", "Paris?", ImEnd, "\n",
		ImStart, "assistant", "\n", "Let me check.",
		"\n<tool_call>\n", call1, "\n</tool_call>",
		"\n<tool_call>\n", call2, "\n</tool_call>", ImEnd, "\n",
		ImStart, "tool", "\n", "<tool_response>\n", "sunny", "\n</tool_response>", ImEnd, "\n",
		ImStart, "assistant", "\n", "Sunny.", ImEnd, "\n",
	)
	checkRender(t, got, want, "<|im_start|>user\nParis?<|im_end|>\n"+
		"<|im_start|>assistant\nLet me check.\n<tool_call>\n"+call1+"\n</tool_call>\n<tool_call>\n"+call2+"\n</tool_call><|im_end|>\n"+
		"<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"+
		"<|im_start|>assistant\nSunny.<|im_end|>\n")
}

func TestRenderContinueFinalMessage(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "Count:"}, {Role: "assistant", Content: "1, 2,"}}
	got := mustRender(t, msgs, nil, RenderOptions{ContinueFinalMessage: true})
	want := seq(ImStart, "user", "\n", "Count:", ImEnd, "\n", ImStart, "assistant", "\n", "1, 2,")
	checkRender(t, got, want, "<|im_start|>user\nCount:<|im_end|>\n<|im_start|>assistant\n1, 2,")

	for _, msgs := range [][]Message{nil, {{Role: "user", Content: "x"}}, {{Role: "assistant"}, {Role: "tool"}}} {
		if _, err := Render(msgs, nil, RenderOptions{ContinueFinalMessage: true}); err == nil {
			t.Errorf("Render(%+v, continue) succeeded, want error", msgs)
		}
	}
}

func TestRenderBothOptions(t *testing.T) {
	msgs := []Message{{Role: "assistant", Content: "x"}}
	if _, err := Render(msgs, nil, RenderOptions{AddGenerationPrompt: true, ContinueFinalMessage: true}); err == nil {
		t.Error("Render with both options succeeded, want error")
	}
}

func TestAppendRender(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "x"}}
	dst := []uint32{EndOfText}
	got, err := AppendRender(dst, msgs, nil, RenderOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	want := append([]uint32{EndOfText}, mustRender(t, msgs, nil, RenderOptions{AddGenerationPrompt: true})...)
	if !slices.Equal(got, want) {
		t.Errorf("AppendRender = %v, want %v", got, want)
	}
	got, err = AppendRender(dst, msgs, nil, RenderOptions{ContinueFinalMessage: true})
	if err == nil || !slices.Equal(got, dst) {
		t.Errorf("AppendRender on error = %v, %v; want dst unchanged and an error", got, err)
	}
}

var fragments = []string{
	"", " ", "\n", "\n\n", "  ", "\t", "hello", " world", "x ", " y\n", "héllo 日本",
	"<|im_end|>", "<tool_call>", "a, b.", "\r\n", "{\"k\": 1}", "!",
}

func randText(r *rand.Rand) string {
	var sb strings.Builder
	for range r.IntN(4) {
		sb.WriteString(fragments[r.IntN(len(fragments))])
	}
	return sb.String()
}

func randMessage(r *rand.Rand, role string) Message {
	m := Message{Role: role, Content: randText(r)}
	switch role {
	case "assistant":
		for i := range r.IntN(3) {
			args := ""
			if r.IntN(2) == 0 {
				args = `{"q": "` + randText(r) + `"}`
			}
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: fmt.Sprint("c", i), Name: randText(r), Arguments: args})
		}
	case "tool":
		m.ToolCallID = "c0"
	}
	return m
}

func randMessages(r *rand.Rand, n int) []Message {
	roles := []string{"system", "developer", "user", "assistant", "tool"}
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = randMessage(r, roles[r.IntN(len(roles))])
	}
	return msgs
}

func isPrefix(prefix, ids []uint32) bool {
	return len(prefix) <= len(ids) && slices.Equal(prefix, ids[:len(prefix)])
}

// TestRenderPrefix checks that a rendered conversation is a token prefix of
// the rendering of any continuation that starts with an assistant reply.
func TestRenderPrefix(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 2000 {
		var tools []Tool
		for i := range r.IntN(3) {
			tools = append(tools, Tool{Name: fmt.Sprint("f", i), Description: randText(r), Parameters: json.RawMessage(`{"type": "object"}`)})
		}
		conv := randMessages(r, 1+r.IntN(5))
		next := slices.Concat(conv, []Message{randMessage(r, "assistant")}, randMessages(r, r.IntN(4)))

		for _, gen := range []bool{false, true} {
			prefix := mustRender(t, conv, tools, RenderOptions{AddGenerationPrompt: gen})
			for _, gen2 := range []bool{false, true} {
				full := mustRender(t, next, tools, RenderOptions{AddGenerationPrompt: gen2})
				if !isPrefix(prefix, full) {
					a, _ := Decode(prefix, false)
					b, _ := Decode(full, false)
					t.Fatalf("iteration %d: Render(C, gen=%v) is not a prefix of Render(C', gen=%v)\nC:  %q\nC': %q", iter, gen, gen2, a, b)
				}
			}
		}
		// Continuing the final assistant message is a prefix too.
		last := len(conv) + 1
		cont := mustRender(t, next[:last], tools, RenderOptions{ContinueFinalMessage: true})
		if full := mustRender(t, next, tools, RenderOptions{}); !isPrefix(cont, full) {
			t.Fatalf("iteration %d: Render(continue) is not a prefix", iter)
		}
	}
}

// TestTemplateVariant: the alternative template differs from the default
// only in its role headers' blank line.
func TestTemplateVariant(t *testing.T) {
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hello there."}}
	def, err := Render(msgs, nil, RenderOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	alt, err := Render(msgs, nil, RenderOptions{AddGenerationPrompt: true, Variant: TemplateAlt})
	if err != nil {
		t.Fatal(err)
	}
	ds, _ := Decode(def, false)
	as, _ := Decode(alt, false)
	if as == ds || strings.ReplaceAll(as, "\n\n", "\n") != ds || strings.Count(as, "\n\n") != 3 {
		t.Fatalf("default %q\nalt %q", ds, as)
	}
}
