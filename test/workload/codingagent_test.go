package workload_test

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/test/workload"
)

// TestCodingAgentClosedLoop: each turn resends the conversation with the
// previous answer and a new input, under the conversation's own salt and
// system prompt, continuing the answer's endpoint; a failed answer ends
// the conversation; a short context ends conversations before a prompt
// (with its output) would not fit.
func TestCodingAgentClosedLoop(t *testing.T) {
	p, err := workload.CodingAgent{Conversations: 30}.Plan(workload.Options{Seed: 4, Rate: 1, MaxModelLen: 32768})
	if err != nil {
		t.Fatal(err)
	}
	salts, systems := map[string]int{}, map[string]int{}
	for i, ps := range p.Sessions {
		var prev *workload.Answer
		var last sentBody
		for turn := 1; ; turn++ {
			req, _, done := ps.Session.Next(prev)
			if done {
				if turn < 3 {
					t.Fatalf("conversation %d: done after %d turns", i, turn-1)
				}
				break
			}
			b := decodeBody(t, req.Body)
			if req.Path != "/v1/chat/completions" || !b.IgnoreEOS || b.CacheSalt == "" || req.Conversation != i || req.Turn != turn {
				t.Fatalf("conversation %d turn %d: %s, ignore_eos %v, salt %q, labels %d/%d", i, turn, req.Path, b.IgnoreEOS, b.CacheSalt, req.Conversation, req.Turn)
			}
			if n := len(b.Messages); n != 2*turn || b.Messages[0].Role != "system" || b.Messages[n-1].Role != "user" {
				t.Fatalf("conversation %d turn %d: %d messages", i, turn, n)
			}
			if turn == 1 {
				salts[b.CacheSalt]++
				systems[b.Messages[0].Content]++
			} else {
				want := append(last.Messages, sentMessage{Role: "assistant", Content: "answer to turn " + strings.Repeat("I", turn-1)})
				for k, m := range want {
					if b.Messages[k] != m {
						t.Fatalf("conversation %d turn %d: message %d is not the history's", i, turn, k)
					}
				}
				if b.CacheSalt != last.CacheSalt || req.Prev != prev.Endpoint {
					t.Fatalf("conversation %d turn %d: salt %q (was %q), prev %q", i, turn, b.CacheSalt, last.CacheSalt, req.Prev)
				}
			}
			last = b
			prev = &workload.Answer{Endpoint: "engine-x", Text: "answer to turn " + strings.Repeat("I", turn), OK: true}
		}
	}
	if len(salts) != 30 || len(systems) != 30 {
		t.Fatalf("%d salts, %d system prompts for 30 conversations", len(salts), len(systems))
	}

	// A failed answer ends the conversation.
	p, _ = workload.CodingAgent{Conversations: 3}.Plan(workload.Options{Seed: 4, Rate: 1})
	s := p.Sessions[0].Session
	if _, _, done := s.Next(nil); done {
		t.Fatal("no first turn")
	}
	if _, _, done := s.Next(&workload.Answer{OK: false}); !done {
		t.Fatal("a turn after a failed answer")
	}

	// A 6K context: every prompt with its output fits, and conversations
	// whose system prompt alone is longer send nothing.
	p, _ = workload.CodingAgent{Conversations: 60}.Plan(workload.Options{Seed: 4, Rate: 1, MaxModelLen: 6_000})
	reqs := drivePlan(t, p, true)
	silent := len(p.Sessions)
	seen := map[int]bool{}
	for _, r := range reqs {
		if r.prompt+r.body.MaxTokens > 6_000 {
			t.Fatalf("conversation %d turn %d: %d + %d tokens", r.req.Conversation, r.req.Turn, r.prompt, r.body.MaxTokens)
		}
		if !seen[r.session] {
			seen[r.session] = true
			silent--
		}
	}
	if silent == 0 || silent == len(p.Sessions) {
		t.Fatalf("%d of %d conversations sent nothing", silent, len(p.Sessions))
	}
}
