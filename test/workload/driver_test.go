package workload

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// fakeExchange is one request a fake drive sent.
type fakeExchange struct {
	Session int           // index in Plan.Sessions
	At      time.Duration // virtual send time from the run's start
	Req     Request
	// PromptTokens is the prompt as the simulated engine renders it (the
	// answer's usage).
	PromptTokens int
}

// fakeDrive runs p in virtual time on this goroutine, with a deterministic
// fake answerer: every request is answered at once with text, endpoint
// "e1" and its rendered prompt tokens (fakePromptTokens). A root starts at
// its Start, a session with After once its parent has been handed the
// answer to that turn or has ended; a session's waits advance its own
// clock. Requests are sent in virtual-time order, ties by session index,
// and returned in that order.
func fakeDrive(t testing.TB, p Plan, text string) []fakeExchange {
	t.Helper()
	type state struct {
		at      time.Duration
		ready   bool // runnable at at
		pending *Request
		prev    *Answer
		sent    int // the turn of the last request sent
		over    bool
	}
	st := make([]state, len(p.Sessions))
	for i, s := range p.Sessions {
		st[i].at, st[i].ready = s.Start, s.After == nil
	}
	// release starts the sessions after i's turns up to turn (all: -1) at.
	release := func(i, turn int, at time.Duration) {
		for j, s := range p.Sessions {
			if s.After != nil && s.After.Session == i && !st[j].ready && !st[j].over && (turn < 0 || s.After.Turn <= turn) {
				st[j].at, st[j].ready = at, true
			}
		}
	}
	var out []fakeExchange
	for steps := 0; ; steps++ {
		if steps > 1_000_000 {
			t.Fatal("the plan does not end")
		}
		i := -1
		for j := range st {
			if st[j].ready && !st[j].over && (i < 0 || st[j].at < st[i].at) {
				i = j
			}
		}
		if i < 0 {
			break
		}
		s := &st[i]
		if s.pending != nil { // send it, and answer at once
			req := *s.pending
			n := fakePromptTokens(t, req)
			out = append(out, fakeExchange{Session: i, At: s.at, Req: req, PromptTokens: n})
			s.pending, s.prev, s.sent = nil, &Answer{Endpoint: "e1", Text: text, PromptTokens: n, OK: true}, req.Turn
			continue
		}
		req, wait, done := p.Sessions[i].Session.Next(s.prev)
		if s.prev != nil {
			release(i, s.sent, s.at)
		}
		if done {
			s.over = true
			release(i, -1, s.at)
			continue
		}
		if wait < 0 {
			t.Fatalf("session %d: a negative wait %v", i, wait)
		}
		s.pending, s.at = &req, s.at+wait
	}
	for i, s := range p.Sessions {
		if !st[i].over {
			t.Fatalf("session %d (after %+v) never ran", i, s.After)
		}
	}
	return out
}

// fakePromptTokens is req's prompt in the simulated engine's tokens: the
// chat template over a Responses or chat body's messages and tools (with
// the generation prompt), a completion's prompt text or token ids.
//
// Bodies are read in one typed decode (fakeRead) when they fit it — the
// chat package's parsers take several passes over a body, and a drive of
// agentic-pressure renders about 700 bodies of up to 150 kB — and by those
// parsers otherwise; on turns 1 and 2 both are run and must agree, so
// the parsers (the engine's) check every kind of item a body holds.
func fakePromptTokens(t testing.TB, req Request) int {
	t.Helper()
	if req.Tokens != nil {
		return len(req.Tokens())
	}
	if req.Path == "/v1/completions" {
		var b struct {
			Prompt json.RawMessage `json:"prompt"`
		}
		if err := json.Unmarshal(req.Body, &b); err != nil {
			t.Fatalf("%s body: %v", req.Path, err)
		}
		var text string
		if json.Unmarshal(b.Prompt, &text) == nil {
			return len(chat.Encode(text))
		}
		var ids []uint32
		if err := json.Unmarshal(b.Prompt, &ids); err != nil {
			t.Fatalf("completion prompt: %v", err)
		}
		return len(ids)
	}
	msgs, tools, ok := fakeRead(req)
	if !ok || req.Turn <= 2 {
		m, tl := fakeParse(t, req)
		if ok && (!reflect.DeepEqual(m, msgs) || !reflect.DeepEqual(tl, tools)) {
			t.Fatalf("%s turn %d: the fast read differs from the parsers'\n%+v\n%+v", req.Path, req.Turn, msgs, m)
		}
		msgs, tools = m, tl
	}
	toks, err := chat.Render(msgs, tools, chat.RenderOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatalf("%s render: %v", req.Path, err)
	}
	return len(toks)
}

// fakeParse is a Responses or chat body's messages and tools by the chat
// package's parsers, as the simulated engine reads them.
func fakeParse(t testing.TB, req Request) ([]chat.Message, []chat.Tool) {
	t.Helper()
	var b struct {
		Instructions string          `json:"instructions"`
		Input        json.RawMessage `json:"input"`
		Messages     json.RawMessage `json:"messages"`
		Tools        json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(req.Body, &b); err != nil {
		t.Fatalf("%s body: %v", req.Path, err)
	}
	var msgs []chat.Message
	var tools []chat.Tool
	var err error
	switch req.Path {
	case "/v1/responses":
		msgs, tools, err = chat.ParseResponsesInput(b.Instructions, b.Input, b.Tools)
	case "/v1/chat/completions":
		if msgs, err = chat.ParseChatMessages(b.Messages); err == nil {
			tools, err = chat.ParseChatTools(b.Tools)
		}
	default:
		t.Fatalf("path %q", req.Path)
	}
	if err != nil {
		t.Fatalf("%s body: %v", req.Path, err)
	}
	return msgs, tools
}

// fakeItem is a Responses input item or a chat message with string
// contents; fakeRead takes no other kind.
type fakeItem struct {
	Type, Role, Content, Name string
	CallID                    string `json:"call_id"`
	Arguments, Output         string
	ToolCalls                 []struct {
		ID       string
		Type     string
		Function struct{ Name, Arguments string }
	} `json:"tool_calls"`
	ToolCallID string `json:"tool_call_id"`
}

// fakeFunction is a tool in either form's fields.
type fakeFunction struct {
	Name, Description string
	Parameters        json.RawMessage
}

// fakeRead is fakeParse in one typed decode, for bodies whose contents and
// arguments are strings and whose items are messages, function calls and
// their outputs; ok false for any other body.
func fakeRead(req Request) (msgs []chat.Message, tools []chat.Tool, ok bool) {
	var b struct {
		Instructions string
		Input        []fakeItem
		Messages     []fakeItem
		Tools        []struct {
			Type string
			fakeFunction
			Function *fakeFunction
		}
	}
	if json.Unmarshal(req.Body, &b) != nil {
		return nil, nil, false
	}
	for _, x := range b.Tools {
		f := x.fakeFunction
		if req.Path == "/v1/chat/completions" {
			if x.Function == nil {
				return nil, nil, false
			}
			f = *x.Function
		}
		if x.Type != "function" || f.Name == "" {
			return nil, nil, false
		}
		if string(f.Parameters) == "null" {
			f.Parameters = nil
		}
		tools = append(tools, chat.Tool{Name: f.Name, Description: f.Description, Parameters: f.Parameters})
	}
	switch req.Path {
	case "/v1/responses":
		if b.Instructions != "" {
			msgs = append(msgs, chat.Message{Role: "system", Content: b.Instructions})
		}
		for _, x := range b.Input {
			switch {
			case (x.Type == "message" || x.Type == "") && x.Role != "" && x.Role != "tool":
				msgs = append(msgs, chat.Message{Role: x.Role, Content: x.Content})
			case x.Type == "function_call":
				// Into the assistant message just before, as vLLM (and
				// the engine) merge contiguous assistant-side items.
				tc := chat.ToolCall{ID: x.CallID, Name: x.Name, Arguments: x.Arguments}
				if k := len(msgs) - 1; k >= 0 && msgs[k].Role == "assistant" {
					msgs[k].ToolCalls = append(msgs[k].ToolCalls, tc)
					break
				}
				msgs = append(msgs, chat.Message{Role: "assistant", ToolCalls: []chat.ToolCall{tc}})
			case x.Type == "function_call_output":
				msgs = append(msgs, chat.Message{Role: "tool", ToolCallID: x.CallID, Content: x.Output})
			default:
				return nil, nil, false
			}
		}
	case "/v1/chat/completions":
		for _, x := range b.Messages {
			m := chat.Message{Role: x.Role, Content: x.Content, Name: x.Name}
			for _, c := range x.ToolCalls {
				m.ToolCalls = append(m.ToolCalls, chat.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
			}
			if x.Role == "tool" {
				m.ToolCallID = x.ToolCallID
			}
			msgs = append(msgs, m)
		}
	default:
		return nil, nil, false
	}
	return msgs, tools, len(msgs) > 0
}

// fakeMessages is a Responses or chat body's conversation as chat
// messages (fakeRead's, or the parsers'), and its tools. A Responses turn's
// assistant text and function call are one message, as in the chat form:
// the engine merges them as vLLM does.
func fakeMessages(t testing.TB, req Request) ([]chat.Message, []chat.Tool) {
	t.Helper()
	msgs, tools, ok := fakeRead(req)
	if !ok {
		msgs, tools = fakeParse(t, req)
	}
	return msgs, tools
}
