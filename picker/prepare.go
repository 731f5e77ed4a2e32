package picker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/zeebo/xxh3"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/render"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/picker/standing"
)

// Prepared is a request after a route's first step (Router.Prepare):
// parsed, its model resolved to an identity group, its tokens rendered and
// keyed, and what the metrics will count of it.
type Prepared struct {
	body       []byte
	kind       intake.Kind // as the route was asked (intake.Any: told by its fields)
	notes      notes
	waited     time.Duration // in the admission queue (Admit)
	req        *intake.Request
	group      string
	ro         *fleet.Roster  // the group's roster, sorted by URL: shared, never modified
	chain      []blockkey.Key // the request's block keys (none: load only, or no tokens)
	keys       []uint64       // chain as the bookings hold it (Prepared.heldKeys), made once
	tokens     []uint32       // its exact tokens (nil: none had), for a peer policy
	prefixHash string         // "" when not anchorable
	dreq       decide.Request
	// standing is its fairness key's standing, charged by Admit
	// (--engine-priority; nil: not yet).
	standing *standing.Standing
}

// notes are what the preparation saw that the metrics count; Pick
// records them with the decision, in one place.
type notes struct {
	refused    string   // refused_total reason, when refused
	unresolved string   // unresolved_total reason
	fallbacks  []string // fallbacks_total reasons
	// tokenized: a full render was made; tokenizeVia and tokenizeSecs
	// are its path and time (retry included).
	tokenized      bool
	tokenizeVia    string
	tokenizeSecs   float64
	tokenizeErrors []string // tokenize_errors_total kinds, one per failed call
}

func (n *notes) fallback(reason string) { n.fallbacks = append(n.fallbacks, reason) }

// unresolvedError refuses an unresolved identity.
func unresolvedError(reason string) *intake.Error {
	return intake.BadRequest("", "unresolved_identity",
		"This request's cache identity cannot be resolved exactly (%s); the picker is configured to refuse such requests.", reason)
}

// prepare is Prepare's work on p (its body and kind set): parse the
// body, resolve the model to its identity group, and (unless the request
// goes by load only) get its exact tokens from an engine of the group and
// compute its block keys and anchor. Errors are refusals for the client.
func (r *Router) prepare(ctx context.Context, p *Prepared) error {
	n, body := &p.notes, p.body
	req, err := r.parser.Parse(p.kind, body)
	if err != nil {
		n.refused = "bad_request"
		return err
	}
	ref, err := r.models.resolve(req.Model)
	if err != nil {
		n.refused = "unknown_model"
		return err
	}
	recordOf(ctx).model = req.Model
	lora := ref.lora
	if req.LoRA != "" {
		// An adapter named apart from the model (the decision API's token
		// bodies) must be one the model's group serves, as vLLM answers an
		// unknown adapter: 404.
		if a, err := r.models.resolve(req.LoRA); err != nil || a.lora != req.LoRA || a.group != ref.group {
			n.refused = "unknown_lora"
			return &intake.Error{Status: http.StatusNotFound, Type: "NotFoundError", Param: "lora", Code: "model_not_found",
				Message: fmt.Sprintf("The LoRA adapter `%s` does not exist for the model `%s`.", req.LoRA, req.Model)}
		}
		lora = req.LoRA
	}
	p.req, p.group, p.ro = req, ref.group, r.groupRoster(ref.group)
	eps := p.endpoints()
	if len(eps) == 0 {
		return noEndpoints(req.Model)
	}
	model, blockSize := eps[0].Info.Model, eps[0].Info.BlockSize
	loadOnly := false
	if blockSize <= 0 {
		// The sidecar has not learnt the engine's block size yet: no keys.
		loadOnly = true
		n.fallback("unknown_block_size")
	}
	if req.Unresolved != "" {
		n.unresolved = req.Unresolved
		switch r.cfg.Unresolved {
		case UnresolvedReject:
			return unresolvedError(req.Unresolved)
		case UnresolvedLoadOnly, UnresolvedPreciseOnly:
			loadOnly = true // nothing known can be scored
		}
	}
	p.dreq = decide.Request{Request: score.Request{Counter: r.counter.Add(1) - 1, LoadOnly: loadOnly}, BlockSize: blockSize}
	if loadOnly {
		return nil
	}
	toks, err := r.tokens(ctx, req, req.Kind, body, p.ro, n)
	switch {
	case err == nil:
		kr := blockkey.Request{Tokens: toks.full, LoRA: lora, CacheSalt: req.CacheSalt, MM: toks.mm}
		p.chain = kr.AppendKeys(nil, model, blockSize)
		p.tokens = toks.full
		p.dreq.PromptTokens = len(toks.full)
		if len(p.chain) > 0 {
			p.dreq.TieKey = uint64(p.chain[0])
		}
		if k := min(toks.anchor/blockSize, len(p.chain)); k > 0 {
			p.dreq.Anchor, p.dreq.HasAnchor = uint64(p.chain[k-1]), true
			p.prefixHash = fmt.Sprintf("%016x", p.dreq.Anchor)
		}
	case isRefusal(err):
		return err
	case errors.Is(err, render.ErrMultimodalTokenize):
		// Media, and no engine of the group renders with multimodal
		// features: the keys would miss the media's identity.
		n.unresolved = "multimodal_without_render"
		if r.cfg.Unresolved == UnresolvedReject {
			return unresolvedError(n.unresolved)
		}
		p.dreq.LoadOnly = true
	default:
		// No tokens in time: place by consistent hashing on the raw
		// anchor, salted, so retries and siblings still meet.
		n.fallback("tokenize_failed")
		r.log.Debug("tokenize failed; consistent-hash fallback", zap.Error(err))
		p.dreq.Anchor, p.dreq.HasAnchor = rawAnchor(req, body, r.cfg.AnchorTokens), true
		p.dreq.Policy = score.PrefixHash
	}
	return nil
}

// groupRoster is the group's roster, its endpoints sorted by URL (nil for
// a group not held): read from the group alone, so a request's cost does
// not grow with the fleet (issue 21), and, from a fleet that publishes
// rosters, the fleet's own, shared, not a copy (issue 37). Read only.
func (r *Router) groupRoster(group string) *fleet.Roster {
	if r.roster != nil {
		return r.roster.Roster(group)
	}
	eps := r.fleet.GroupEndpoints(group)
	if eps == nil {
		return nil
	}
	out := make([]*fleet.Endpoint, len(eps))
	for i := range eps {
		out[i] = &eps[i]
	}
	return fleet.NewRoster(out)
}

// endpoints are p's group's endpoints, its roster's (none before
// Prepare found the group). Read only.
func (p *Prepared) endpoints() []*fleet.Endpoint {
	if p.ro == nil {
		return nil
	}
	return p.ro.Endpoints
}

// reportFailure tells the fleet view's passive outlier detection that an
// engine could not be reached, and drops the pooled connections: those to
// a dead engine would fail the next requests too (a POST is not retried on
// a stale connection), including those to a new process on its port.
func (r *Router) reportFailure(url, reason string) {
	r.proxy.CloseIdleConnections()
	r.render.Close() // closes idle connections only
	if r.fleet != nil {
		r.fleet.ReportFailure(url, reason)
	}
}

func isRefusal(err error) bool {
	var ie *intake.Error
	var re *render.RefusedError
	return errors.As(err, &ie) || errors.As(err, &re)
}

// rawAnchor is a salted hash of what the request's anchor is made of, for
// placing it without tokens.
func rawAnchor(req *intake.Request, body []byte, anchorTokens int) uint64 {
	h := xxh3.New()
	_, _ = h.WriteString(req.Model)
	_, _ = h.Write([]byte{0})
	_, _ = h.WriteString(req.CacheSalt)
	_, _ = h.Write([]byte{0})
	switch {
	case req.RawAnchor != nil:
		_, _ = h.Write(req.RawAnchor)
	case req.TokenIDs != nil:
		for _, t := range req.TokenIDs[:min(len(req.TokenIDs), anchorTokens)] {
			_, _ = h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
		}
	default:
		_, _ = h.Write(body)
	}
	return h.Sum64()
}

// tokensOf is a request's tokens and how many of them are its anchor.
type tokensOf struct {
	full   []uint32
	anchor int
	mm     []blockkey.MMItem
}

// tokens gets the request's tokens: as sent, or rendered by an engine of
// its group (the anchor rendered alongside).
func (r *Router) tokens(ctx context.Context, req *intake.Request, kind intake.Kind, body []byte, ro *fleet.Roster, n *notes) (tokensOf, error) {
	if req.TokenIDs != nil {
		if !req.Anchorable {
			return tokensOf{full: req.TokenIDs}, nil
		}
		return tokensOf{full: req.TokenIDs, anchor: min(len(req.TokenIDs), r.cfg.AnchorTokens)}, nil
	}
	engines := decide.RenderOrderOf(&r.dcfg, ro, r.now())
	if len(engines) == 0 {
		return tokensOf{}, errors.New("no healthy engine to render with")
	}
	engine, group := engines[0], ro.Endpoints[0].Group
	ctx, cancel := context.WithTimeout(ctx, r.cfg.TokenizeTimeout)
	defer cancel()
	type result struct {
		r   render.Rendered
		err error
	}
	var anchorCh chan result
	if req.AnchorBody != nil {
		anchorCh = make(chan result, 1)
		go func() {
			body, kind := req.AnchorBody, kind
			if kind == intake.Responses {
				var err error
				if body, err = render.ResponsesAnchor(body); err != nil {
					anchorCh <- result{err: err}
					return
				}
				kind = intake.Chat
			}
			a, _, err := r.renderShared(ctx, group, 0, engine, kind, body)
			anchorCh <- result{a, err}
		}()
	}
	if req.RenderBody != nil {
		body = req.RenderBody // a batch: its first prompt alone
	}
	t0 := time.Now()
	// With another engine to fall back on, the first gets half the time:
	// a hung engine then costs half the budget, not all of it.
	first := ctx
	if len(engines) > 1 {
		var cancel context.CancelFunc
		first, cancel = context.WithTimeout(ctx, r.cfg.TokenizeTimeout/2)
		defer cancel()
	}
	full, joined, err := r.renderShared(first, group, 0, engine, kind, body)
	if err != nil && !isRefusal(err) && ctx.Err() == nil && !joined { // a joined call's failure is its leader's to report
		r.reportFailure(engine, "render: "+err.Error())
	}
	if err != nil && !isRefusal(err) && ctx.Err() == nil && len(engines) > 1 {
		// That engine could not be reached in time: another of the group
		// renders the same tokens (the anchor, if it failed too, only
		// costs the prefix hash).
		n.tokenizeErrors = append(n.tokenizeErrors, errKind(err))
		full, joined, err = r.renderShared(ctx, group, 1, engines[1], kind, body)
		if err != nil && !isRefusal(err) && ctx.Err() == nil && !joined {
			r.reportFailure(engines[1], "render: "+err.Error())
		}
	}
	n.tokenized, n.tokenizeVia, n.tokenizeSecs = true, full.Via, time.Since(t0).Seconds()
	if err != nil {
		n.tokenizeErrors = append(n.tokenizeErrors, errKind(err))
		return tokensOf{}, err
	}
	out := tokensOf{full: full.TokenIDs, mm: full.MM}
	switch {
	case !req.Anchorable:
	case anchorCh == nil && kind == intake.Completion:
		out.anchor = min(len(full.TokenIDs), r.cfg.AnchorTokens)
	case anchorCh == nil:
		out.anchor = len(full.TokenIDs) // the anchor is the whole prompt
	default:
		a := <-anchorCh
		if a.err != nil {
			n.tokenizeErrors = append(n.tokenizeErrors, errKind(a.err))
			n.fallback("anchor_render_failed")
			break // no prefix hash; routing is unaffected
		}
		k := 0
		for k < len(a.r.TokenIDs) && k < len(full.TokenIDs) && a.r.TokenIDs[k] == full.TokenIDs[k] {
			k++
		}
		out.anchor = k
	}
	return out, nil
}

// renderShared renders body on engine, or joins an identical render of
// the group in flight (issue 21: many clients sending the same prompt at
// once cost one engine call). attempt keeps a fallback from joining the
// call it falls back from. joined: the answer (or failure) was another
// caller's call.
func (r *Router) renderShared(ctx context.Context, group string, attempt int, engine string, kind intake.Kind, body []byte) (render.Rendered, bool, error) {
	var rd Renderer = r.render
	if r.cfg.Renderer != nil {
		rd = r.cfg.Renderer
	}
	call := func(ctx context.Context) (render.Rendered, error) { return rd.Render(ctx, engine, kind, body) }
	if r.coal == nil {
		rd, err := call(ctx)
		return rd, false, err
	}
	return r.coal.Do(ctx, render.KeyOf(group, kind, attempt, body), body, call)
}

func errKind(err error) string {
	var re *render.RefusedError
	switch {
	case errors.As(err, &re):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "error"
}
