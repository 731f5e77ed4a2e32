package enginesim

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/kvroute/kvroute/test/enginesim/chat"
	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// generation is a generate request once its body is prepared: what to run.
type generation struct {
	id        identity
	salt      string
	prompts   [][]uint32
	budgets   []int // max tokens, per prompt
	ignoreEOS bool
	stream    bool
	// kvParams is the body's kv_transfer_params, as sent.
	kvParams json.RawMessage
	// priority is the body's priority (default 0; lower runs first under
	// --scheduling-policy priority).
	priority int
}

// endpoint is what differs between the generate endpoints (chat
// completions, completions, Responses): the body's parsing and checks, and
// the answer's shape. One value serves one HTTP request.
type endpoint interface {
	// prepare decodes and checks the body, with vLLM's checks in vLLM's
	// order.
	prepare(w http.ResponseWriter, r *http.Request) (generation, error)
	// begin is called once the prompts are in the engine: the answer's
	// ids and creation time.
	begin()
	// whole is the non-streaming answer's body.
	whole(outs []output) any
	// open writes what a stream sends before any output.
	open(s *sse) error
	// next writes a stream's events for one update; outs already holds it.
	next(s *sse, u update, outs []output) error
	// close ends a stream once every prompt is done.
	close(s *sse, outs []output)
}

// generate is the one path of the generate endpoints: prepare, start the
// prompts, then answer whole or as a stream. Errors before the answer
// starts get vLLM's error body; a stream that breaks is counted; a client
// that goes away cancels its prompts.
func (e *Engine) generate(w http.ResponseWriter, r *http.Request, ep endpoint) {
	g, err := ep.prepare(w, r)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	rn, err := e.start(r.Context(), g, e.kvSourceOf(g.kvParams))
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	ep.begin()
	if !g.stream {
		outs, err := rn.collect(r.Context())
		if err != nil {
			e.failErr(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, ep.whole(outs))
		return
	}
	outs := make([]output, len(rn.reqs))
	s := newSSE(w)
	if ep.open(s) != nil {
		rn.cancel()
		return
	}
	err = rn.each(r.Context(), func(u update) error {
		outs[u.index].add(u)
		return ep.next(s, u, outs)
	})
	if err != nil {
		e.streamFailed(r, err)
		return
	}
	ep.close(s, outs)
}

// run is a set of prompts in the engine for one HTTP request.
type run struct {
	e      *Engine
	done   <-chan struct{} // the engine's scheduler has stopped
	box    *mailbox
	reqs   []*request
	prompt []int
}

// start hands g's prompts to the engine, each with its output budget and
// the KV source to pull its prefix from (none: the zero kvSource).
func (e *Engine) start(ctx context.Context, g generation, src kvSource) (*run, error) {
	if err := e.cfg.checkPriority(g.priority); err != nil {
		return nil, err
	}
	rn := &run{e: e, box: newMailbox(), done: e.done}
	for i, p := range g.prompts {
		if len(p) == 0 {
			return nil, badRequest("The prompt is empty.")
		}
		spec := sched.Request{ID: sched.ID(e.nextID.Add(1)), Prompt: p, LoRA: g.id.lora, LoraID: g.id.loraID, Salt: g.salt,
			MaxTokens: g.budgets[i], IgnoreEOS: g.ignoreEOS, Priority: g.priority}
		setSource(&spec, src)
		rn.reqs = append(rn.reqs, &request{
			spec:   spec,
			index:  i,
			box:    rn.box,
			source: src,
		})
		rn.prompt = append(rn.prompt, len(p))
	}
	if err := e.submit(ctx, rn.reqs...); err != nil {
		rn.cancel()
		return nil, &apiError{status: http.StatusServiceUnavailable, msg: err.Error()}
	}
	return rn, nil
}

// cancel drops the run's prompts from the engine.
func (rn *run) cancel() {
	ids := make([]sched.ID, len(rn.reqs))
	for i, r := range rn.reqs {
		ids[i] = r.spec.ID
	}
	rn.e.cancel(ids)
}

// output is one prompt's result.
type output struct {
	tokens []uint32
	cached int
	finish string
}

// add folds an update into the output.
func (o *output) add(u update) {
	if u.first {
		o.cached = u.cachedTokens
	}
	if u.hasToken {
		o.tokens = append(o.tokens, u.token)
	}
	if u.done {
		o.finish = u.finish
	}
}

// each delivers updates until every prompt is done, the handler's context
// ends, or fn returns an error.
func (rn *run) each(ctx context.Context, fn func(update) error) error {
	left := len(rn.reqs)
	for left > 0 {
		select {
		case <-rn.box.notify:
		case <-ctx.Done():
			rn.cancel()
			return ctx.Err()
		case <-rn.done:
			if rn.box.empty() {
				rn.cancel()
				return &apiError{status: http.StatusServiceUnavailable, msg: ErrClosed.Error()}
			}
		}
		for _, u := range rn.box.take() {
			if u.err != nil {
				rn.cancel()
				return &apiError{status: http.StatusInternalServerError, msg: "request aborted: " + u.err.Error()}
			}
			if err := fn(u); err != nil {
				rn.cancel()
				return err
			}
			if u.done {
				left--
			}
		}
	}
	return nil
}

// collect waits for every prompt's full output.
func (rn *run) collect(ctx context.Context) ([]output, error) {
	outs := make([]output, len(rn.reqs))
	err := rn.each(ctx, func(u update) error {
		outs[u.index].add(u)
		return nil
	})
	return outs, err
}

func text(tokens []uint32) string {
	s, _ := chat.Decode(tokens, true)
	return s
}

// usage builds the chat/completions usage object; prompt_tokens_details is
// there only with --enable-prompt-tokens-details and a non-zero hit.
func (e *Engine) usage(prompt, completion, cached int) map[string]any {
	u := map[string]any{"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
	if e.cfg.EnablePromptTokensDetails && cached > 0 {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": cached}
	}
	return u
}
