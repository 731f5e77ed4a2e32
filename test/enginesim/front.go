package enginesim

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"

	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// Front is an engine's request front end without its loop, sockets or
// metrics: it parses, checks and renders generate bodies exactly as the
// HTTP engine does (the same code), and builds the scheduler core's
// configuration from the engine's, for a caller that drives the core
// itself — the lab, in virtual time (DESIGN.md §14).
type Front struct {
	e *Engine
}

// NewFront returns the front end of an engine configured by cfg.
func NewFront(cfg Config) (*Front, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Front{e: &Engine{cfg: &cfg}}, nil
}

// Generation is a generate request once prepared: what the engine runs.
type Generation struct {
	Model     string // the served name or adapter the body named
	LoRA      string // adapter name ("" none)
	LoraID    int
	Salt      string // cache_salt ("" none)
	Prompt    []uint32
	MaxTokens int // the output budget, after max_model_len
	IgnoreEOS bool
	Stream    bool
	Priority  int // the body's priority (0 unless the engine schedules by priority)
}

// Prepare parses and checks a generate body for path (/v1/chat/completions,
// /v1/completions or /v1/responses) with vLLM's checks in vLLM's order and
// renders its prompt. A batch of completion prompts is refused: one
// generation per body. An error is the engine's refusal (StatusOf).
func (f *Front) Prepare(path string, body []byte) (Generation, error) {
	var ep endpoint
	switch path {
	case "/v1/chat/completions":
		ep = &chatGen{e: f.e}
	case "/v1/completions":
		ep = &completionsGen{e: f.e}
	case "/v1/responses":
		ep = &responsesGen{e: f.e}
	default:
		return Generation{}, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no generate endpoint %q", path)}
	}
	r, err := http.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return Generation{}, badRequest("%v", err)
	}
	g, err := ep.prepare(nil, r)
	if err != nil {
		return Generation{}, err
	}
	if len(g.prompts) != 1 {
		return Generation{}, badRequest("the lab runs one prompt per request, not %d", len(g.prompts))
	}
	if err := f.e.cfg.checkPriority(g.priority); err != nil {
		return Generation{}, err
	}
	return Generation{Model: g.id.model, LoRA: g.id.lora, LoraID: g.id.loraID, Salt: g.salt, Prompt: g.prompts[0],
		MaxTokens: g.budgets[0], IgnoreEOS: g.ignoreEOS, Stream: g.stream, Priority: g.priority}, nil
}

// Sched is the scheduler core's configuration for this engine.
func (f *Front) Sched() sched.Config { return schedConfig(f.e.cfg) }

// Text is the output text of tokens, as the engine's answers carry it.
func Text(tokens []uint32) string { return text(tokens) }

// StatusOf is the HTTP status of an engine's refusal (Prepare's error):
// 400 for a bad request, 404 for an unknown model; 500 for any other
// error.
func StatusOf(err error) int {
	var a *apiError
	if errors.As(err, &a) {
		return a.status
	}
	return http.StatusInternalServerError
}
