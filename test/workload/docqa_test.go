package workload_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
	"github.com/kvroute/kvroute/test/workload"
)

// TestDocQAConversation: a conversation is its document's: turn 1 is the
// document and a question; each later turn resends the previous prompt
// with the answer and a new question appended, so the previous prompt's
// tokens are a prefix of the next's (the owner hits on all of it), and
// continues the answer's endpoint after Think; every turn asks for
// exactly AnswerTokens (ignore_eos); conversations have Turns turns and
// share nothing. A failed answer ends the conversation.
func TestDocQAConversation(t *testing.T) {
	d := workload.DocQA{Conversations: 12, Think: 700 * time.Millisecond}
	p, err := d.Plan(workload.Options{Seed: 4, Rate: 1, MaxModelLen: d.Fleet().MaxModelLen})
	if err != nil {
		t.Fatal(err)
	}
	var firstBlocks []string
	for i, ps := range p.Sessions {
		var prev *workload.Answer
		var last string
		var lastToks []uint32
		for turn := 1; ; turn++ {
			req, wait, done := ps.Session.Next(prev)
			if done {
				if turn != 7 {
					t.Fatalf("conversation %d: done after %d turns, want 6", i, turn-1)
				}
				break
			}
			b := decodeBody(t, req.Body)
			prompt, _ := b.Prompt.(string)
			if req.Path != "/v1/completions" || !b.IgnoreEOS || b.MaxTokens != 64 || b.CacheSalt != "" || req.Conversation != i || req.Turn != turn {
				t.Fatalf("conversation %d turn %d: %s, ignore_eos %v, max_tokens %d, salt %q, labels %d/%d", i, turn, req.Path, b.IgnoreEOS, b.MaxTokens,
					b.CacheSalt, req.Conversation, req.Turn)
			}
			toks := chat.Encode(prompt)
			if turn == 1 {
				if !strings.HasPrefix(prompt, fmt.Sprintf("Document %d. ", i)) || wait != 0 || req.Prev != "" {
					t.Fatalf("conversation %d: first turn %.40q, wait %v, prev %q", i, prompt, wait, req.Prev)
				}
				// The document and its question: 16,000–32,000 tokens and
				// 256, with their labels.
				if len(toks) < 16000+256 || len(toks) > 32000+256+32 {
					t.Fatalf("conversation %d: a first prompt of %d tokens", i, len(toks))
				}
				firstBlocks = append(firstBlocks, prompt[:200])
			} else {
				rest, ok := strings.CutPrefix(prompt, last+"\nAnswer: "+prev.Text+fmt.Sprintf("\nQuestion %d: ", turn))
				if !ok || wait != d.Think || req.Prev != prev.Endpoint {
					t.Fatalf("conversation %d turn %d: the prompt does not continue the last (%v), wait %v, prev %q", i, turn, ok, wait, req.Prev)
				}
				if n := len(chat.Encode(rest)); n < 256 || n > 256+8 {
					t.Fatalf("conversation %d turn %d: a question of %d tokens", i, turn, n)
				}
				if len(toks) <= len(lastToks) || !slices.Equal(toks[:len(lastToks)], lastToks) {
					t.Fatalf("conversation %d turn %d: the last prompt's tokens are not a prefix of this one's", i, turn)
				}
			}
			last, lastToks = prompt, toks
			// An answer that ends in a space: the next part starts on a
			// newline, and the prefix holds all the same.
			prev = &workload.Answer{Endpoint: fmt.Sprintf("engine-%d", turn%3), Text: "answer to turn " + strings.Repeat("I", turn) + " ", OK: true}
		}
	}
	slices.Sort(firstBlocks)
	if len(slices.Compact(firstBlocks)) != 12 {
		t.Fatal("two conversations share a document's start")
	}

	// A failed answer ends the conversation.
	p, _ = workload.DocQA{Conversations: 2}.Plan(workload.Options{Seed: 4, Rate: 1})
	s := p.Sessions[0].Session
	if _, _, done := s.Next(nil); done {
		t.Fatal("no first turn")
	}
	if _, _, done := s.Next(&workload.Answer{OK: false}); !done {
		t.Fatal("a turn after a failed answer")
	}
}

// TestDocQAContext: with a context short of the longest conversation,
// every prompt with its answer fits, and conversations end early rather
// than send one that would not; a context short of the longest first
// turn is refused.
func TestDocQAContext(t *testing.T) {
	// 16,000–17,000-token documents: the first turn fits in 18,300, the
	// later ones do not all.
	const ctx = 18_300
	d := workload.DocQA{Conversations: 30, DocMin: 16_000, DocMax: 17_000}
	p, err := d.Plan(workload.Options{Seed: 5, Rate: 1, MaxModelLen: ctx})
	if err != nil {
		t.Fatal(err)
	}
	reqs := drivePlan(t, p, true)
	turns := map[int]int{}
	for _, r := range reqs {
		if r.prompt+r.body.MaxTokens > ctx {
			t.Fatalf("conversation %d turn %d: %d + %d tokens", r.req.Conversation, r.req.Turn, r.prompt, r.body.MaxTokens)
		}
		turns[r.req.Conversation]++
	}
	short := 0
	for i := range p.Sessions {
		switch n := turns[i]; {
		case n < 1:
			t.Fatalf("conversation %d sent nothing", i)
		case n < 6:
			short++
		}
	}
	if short == 0 || short == len(p.Sessions) {
		t.Fatalf("%d of %d conversations ended early", short, len(p.Sessions))
	}
	if _, err := d.Plan(workload.Options{Seed: 5, Rate: 1, MaxModelLen: 17_000}); err == nil || !strings.Contains(err.Error(), "fit") {
		t.Fatalf("a context short of the longest first turn: %v", err)
	}
}
