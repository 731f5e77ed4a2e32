package render_test

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/render"
)

// TestResponsesItemsAsVLLM: Responses input with reasoning items (and the
// assistant-side items they sit among) gives the chat messages vLLM's
// non-Harmony Responses path builds (vllm/entrypoints/openai/responses/
// utils.py, construct_chat_messages_with_tool_call, since PR #42189):
// reasoning as an assistant message's "reasoning", contiguous assistant-side
// items merged, an assistant message's first part only. The golden is that
// chat request, written out by hand from vLLM's code: the picker's mapping
// must give it exactly, and the engine's own Responses render, the picker's
// mapped render and the engine's render of the golden must be the same
// tokens.
func TestResponsesItemsAsVLLM(t *testing.T) {
	tests := []struct {
		name, input, golden string
	}{
		{
			name: "reasoning alone is an assistant turn",
			input: `[{"role":"user","content":"Q"},
				{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"sum"}],"content":[{"type":"reasoning_text","text":"think"}],"encrypted_content":"opaque"},
				{"role":"user","content":"Q2"}]`,
			golden: `[{"role":"user","content":"Q"},{"role":"assistant","reasoning":"think"},{"role":"user","content":"Q2"}]`,
		},
		{
			name: "reasoning, text and calls share one turn",
			input: `[{"role":"user","content":"Q"},
				{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"sum"}]},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Looking."},{"type":"output_text","text":" Dropped."}]},
				{"type":"function_call","call_id":"c1","name":"lookup","arguments":"{\"q\":\"a\"}"},
				{"type":"function_call","call_id":"c2","name":"lookup","arguments":"{\"q\":\"b\"}"},
				{"type":"function_call_output","call_id":"c1","output":"1"},
				{"type":"function_call_output","call_id":"c2","output":"2"},
				{"type":"reasoning","id":"rs_2","summary":[]},
				{"role":"assistant","content":"Done."}]`,
			golden: `[{"role":"user","content":"Q"},
				{"role":"assistant","reasoning":"sum","content":"Looking.","tool_calls":[
					{"id":"c1","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"a\"}"}},
					{"id":"c2","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"b\"}"}}]},
				{"role":"tool","tool_call_id":"c1","content":"1"},
				{"role":"tool","tool_call_id":"c2","content":"2"},
				{"role":"assistant","reasoning":"","content":"Done."}]`,
		},
		{
			name: "a second reasoning or text starts a new turn",
			input: `[{"role":"user","content":"Q"},
				{"role":"assistant","content":"A"},
				{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"r1"}]},
				{"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"r2"}]},
				{"role":"assistant","content":"B"},
				{"role":"assistant","content":"C"}]`,
			golden: `[{"role":"user","content":"Q"},
				{"role":"assistant","content":"A","reasoning":"r1"},
				{"role":"assistant","reasoning":"r2","content":"B"},
				{"role":"assistant","content":"C"}]`,
		},
	}
	withRender, without := startEngine(t, true), startEngine(t, false)
	c := render.New(5*time.Second, 8<<20)
	defer c.Close()
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"Qwen/Qwen3-0.6B","instructions":"Be terse.","input":` + tt.input + `}`
			chatBody, err := render.ResponsesAsChat([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			var got struct{ Messages any }
			var want any
			if err := json.Unmarshal(chatBody, &got); err != nil {
				t.Fatal(err)
			}
			golden := `[{"role":"system","content":"Be terse."},` + tt.golden[1:]
			if err := json.Unmarshal([]byte(golden), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Messages, want) {
				t.Fatalf("mapped messages\n got %s\nwant %s", chatBody, golden)
			}

			native, err := c.Render(ctx, withRender.URL(), intake.Responses, []byte(body))
			if err != nil || native.Via != render.ViaResponsesRender {
				t.Fatalf("responses render: %+v %v", native, err)
			}
			mapped, err := c.Render(ctx, without.URL(), intake.Responses, []byte(body))
			if err != nil || mapped.Via != render.ViaResponsesAsChat {
				t.Fatalf("responses as chat: %+v %v", mapped, err)
			}
			gold, err := c.Render(ctx, without.URL(), intake.Chat, []byte(`{"model":"Qwen/Qwen3-0.6B","messages":`+golden+`}`))
			if err != nil {
				t.Fatalf("golden chat render: %v", err)
			}
			if !slices.Equal(native.TokenIDs, gold.TokenIDs) {
				t.Errorf("engine's Responses render differs from vLLM's chat form: %d vs %d tokens", len(native.TokenIDs), len(gold.TokenIDs))
			}
			if !slices.Equal(mapped.TokenIDs, gold.TokenIDs) {
				t.Errorf("picker's mapped render differs from vLLM's chat form: %d vs %d tokens", len(mapped.TokenIDs), len(gold.TokenIDs))
			}
		})
	}
}
