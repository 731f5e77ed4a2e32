package enginesim_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// client returns the official OpenAI Go SDK pointed at the engine.
func client(url string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// TestSDKChat: chat completions through the SDK, with cache_salt; the
// repeat reports cached tokens and another salt shares nothing.
func TestSDKChat(t *testing.T) {
	e := start(t, testConfig()).Engines()[0]
	c := client(e.URL())
	params := openai.ChatCompletionNewParams{
		Model: "Qwen/Qwen3-0.6B",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You are a precise assistant who answers questions about caching in detail."),
			openai.UserMessage("Explain prefix caching in two sentences, please, with an example."),
		},
		MaxTokens: openai.Int(8),
	}
	first, err := c.Chat.Completions.New(ctx(t), params, option.WithJSONSet("cache_salt", "tenant-a"))
	if err != nil {
		t.Fatal(err)
	}
	if first.Choices[0].Message.Content == "" || first.Usage.CompletionTokens != 8 || first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first: %+v", first)
	}
	again, err := c.Chat.Completions.New(ctx(t), params, option.WithJSONSet("cache_salt", "tenant-a"))
	if err != nil {
		t.Fatal(err)
	}
	if again.Usage.PromptTokensDetails.CachedTokens == 0 || again.Choices[0].Message.Content != first.Choices[0].Message.Content {
		t.Fatalf("repeat: cached %d, content %q vs %q", again.Usage.PromptTokensDetails.CachedTokens, again.Choices[0].Message.Content, first.Choices[0].Message.Content)
	}
	other, err := c.Chat.Completions.New(ctx(t), params, option.WithJSONSet("cache_salt", "tenant-b"))
	if err != nil {
		t.Fatal(err)
	}
	if other.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("tenant-b hit %d of tenant-a's tokens", other.Usage.PromptTokensDetails.CachedTokens)
	}
	// The SDK surfaces vLLM-style errors.
	_, err = c.Chat.Completions.New(ctx(t), openai.ChatCompletionNewParams{Model: "missing", Messages: params.Messages})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.Message, "does not exist") {
		t.Fatalf("unknown model: %v", err)
	}
}

// TestSDKChatStreaming: streamed chunks accumulate to the non-streamed
// answer, with usage at the end.
func TestSDKChatStreaming(t *testing.T) {
	e := start(t, testConfig()).Engines()[0]
	c := client(e.URL())
	params := openai.ChatCompletionNewParams{
		Model:         "Qwen/Qwen3-0.6B",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Stream me a short answer.")},
		MaxTokens:     openai.Int(12),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	whole, err := c.Chat.Completions.New(ctx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	stream := c.Chat.Completions.NewStreaming(ctx(t), params)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != whole.Choices[0].Message.Content || chunks < 3 {
		t.Fatalf("streamed %q in %d chunks, whole %q", acc.Choices[0].Message.Content, chunks, whole.Choices[0].Message.Content)
	}
	if acc.Usage.CompletionTokens != whole.Usage.CompletionTokens || acc.Usage.PromptTokens != whole.Usage.PromptTokens {
		t.Fatalf("stream usage %+v, whole %+v", acc.Usage, whole.Usage)
	}
	if acc.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatal("the streamed repeat reported no cached tokens")
	}
}

// TestSDKCompletions: text and token-id prompts, plain and streaming.
func TestSDKCompletions(t *testing.T) {
	e := start(t, testConfig()).Engines()[0]
	c := client(e.URL())
	ids := make([]int64, 40)
	for i := range ids {
		ids[i] = int64(3000 + i)
	}
	for _, prompt := range []openai.CompletionNewParamsPromptUnion{
		{OfString: openai.String("Once upon a time in a data center far away")},
		{OfArrayOfTokens: ids},
	} {
		p := openai.CompletionNewParams{Model: "Qwen/Qwen3-0.6B", Prompt: prompt, MaxTokens: openai.Int(5)}
		r, err := c.Completions.New(ctx(t), p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Choices[0].Text == "" || r.Usage.CompletionTokens != 5 || r.Object != "text_completion" {
			t.Fatalf("completion %+v", r)
		}
		stream := c.Completions.NewStreaming(ctx(t), p)
		var text strings.Builder
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				text.WriteString(ch.Text)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.String() != r.Choices[0].Text {
			t.Fatalf("streamed %q, whole %q", text.String(), r.Choices[0].Text)
		}
	}
	// A batch of prompts gives one choice each.
	r, err := c.Completions.New(ctx(t), openai.CompletionNewParams{Model: "Qwen/Qwen3-0.6B",
		Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"first", "second"}}, MaxTokens: openai.Int(3)})
	if err != nil || len(r.Choices) != 2 || r.Choices[1].Index != 1 {
		t.Fatalf("batch: %+v %v", r, err)
	}
}

// TestSDKResponses: a stateless Responses conversation with instructions,
// a function call and its output; plain and streaming; the continuation
// reuses the conversation's cached prefix.
func TestSDKResponses(t *testing.T) {
	e := start(t, testConfig()).Engines()[0]
	c := client(e.URL())
	turn1 := responses.ResponseInputParam{
		responses.ResponseInputItemParamOfMessage("What's the weather in Paris? Use the tool, then answer briefly.", responses.EasyInputMessageRoleUser),
	}
	tools := []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{
		Name:       "get_weather",
		Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
	}}}
	params := responses.ResponseNewParams{
		Model:        "Qwen/Qwen3-0.6B",
		Instructions: openai.String("You are a weather assistant with a long, fixed system prompt for caching."),
		Input:        responses.ResponseNewParamsInputUnion{OfInputItemList: turn1},
		Tools:        tools,
	}
	r1, err := c.Responses.New(ctx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Status != "completed" || r1.OutputText() == "" || r1.Usage.InputTokens == 0 {
		t.Fatalf("response %+v", r1)
	}
	turn2 := append(turn1,
		responses.ResponseInputItemParamOfFunctionCall(`{"city":"Paris"}`, "call_1", "get_weather"),
		functionOutput("call_1", "18°C, clear"),
	)
	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: turn2}
	r2, err := c.Responses.New(ctx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Usage.InputTokensDetails.CachedTokens == 0 || r2.Usage.InputTokens <= r1.Usage.InputTokens {
		t.Fatalf("continuation: %+v", r2.Usage)
	}
	stream := c.Responses.NewStreaming(ctx(t), params)
	var deltas strings.Builder
	var completed *responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed":
			r := ev.AsResponseCompleted().Response
			completed = &r
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if completed == nil || completed.OutputText() != deltas.String() || deltas.String() != r2.OutputText() {
		t.Fatalf("streamed %q, completed %v, plain %q", deltas.String(), completed, r2.OutputText())
	}
	// previous_response_id is refused: this engine is stateless.
	_, err = c.Responses.New(ctx(t), responses.ResponseNewParams{Model: "Qwen/Qwen3-0.6B",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}, PreviousResponseID: openai.String(r1.ID)})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
		t.Fatalf("previous_response_id: %v", err)
	}
}

func functionOutput(callID, output string) responses.ResponseInputItemUnionParam {
	item := responses.ResponseInputItemParamOfFunctionCallOutput(output)
	item.OfFunctionCallOutput.CallID = openai.String(callID)
	return item
}
