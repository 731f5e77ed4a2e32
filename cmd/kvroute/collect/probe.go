package collect

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/verify"
	"github.com/kvroute/kvroute/picker/intake"
)

// probe runs one token-parity probe of kind for model through the picker:
// sent twice under a fresh salt, then once more under another.
func (c *Collector) probe(ctx context.Context, kind, model string, fleet []debugapi.Endpoint) verify.ProbeResult {
	p := verify.ProbeResult{Name: kind, Model: model}
	path, body := probeBody(kind, model, salt())
	fail := func(format string, args ...any) verify.ProbeResult {
		p.Err = fmt.Sprintf(format, args...)
		return p
	}
	h, u, err := c.send(ctx, c.picker+path, body)
	if err != nil {
		return fail("first send: %v", err)
	}
	p.FirstEndpoint = h.Get("X-Kvroute-Endpoint")
	// The picker's keys for the prompt (one explained decision: polling the
	// decision API would count every poll as a request in flight).
	pick, err := c.decide(ctx, body)
	if err != nil {
		return fail("decision API: %v", err)
	}
	// Wait until the first endpoint's sidecar holds the prompt's last key
	// (events travel engine → sidecar), then a moment for the summary to
	// reach the picker.
	if first, ok := verify.FindEndpoint(fleet, p.FirstEndpoint); ok && first.SidecarDebug != "" && len(pick.Keys) > 0 {
		last := pick.Keys[len(pick.Keys)-1]
		for deadline := time.Now().Add(c.settle); ; {
			if ok, _ := c.indexed(ctx, first, last); ok || time.Now().After(deadline) {
				break
			}
			if !sleep(ctx, 50*time.Millisecond) {
				return fail("%v", ctx.Err())
			}
		}
	}
	if !sleep(ctx, 250*time.Millisecond) {
		return fail("%v", ctx.Err())
	}
	p.Keys, p.PromptTokens = len(pick.Keys), pick.PromptTokens
	h, u, err = c.send(ctx, c.picker+path, body)
	if err != nil {
		return fail("second send: %v", err)
	}
	p.SecondEndpoint = h.Get("X-Kvroute-Endpoint")
	p.Predicted, _ = strconv.Atoi(h.Get("X-Kvroute-Matched-Tokens"))
	p.EngineCached = u.Cached
	target, err := verify.ProbeTarget(fleet, p.SecondEndpoint, model)
	if err != nil {
		return fail("%v", err)
	}
	p.BlockSize = target.BlockSize
	if target.SidecarDebug == "" {
		p.KeysError = "the endpoint's sidecar debug URL is unknown (--admin-advertise)"
	}
	for _, k := range pick.Keys {
		if p.KeysError != "" {
			break
		}
		ok, err := c.indexed(ctx, target, k)
		if err != nil {
			p.KeysError = err.Error()
		} else if ok {
			p.KeysIndexed++
		}
	}
	// The same prompt under another salt shares nothing: no candidate
	// predicted to hold any of it, and the endpoint that cached the first
	// salt's blocks (asked directly) reports none.
	_, other := probeBody(kind, model, salt())
	op, err := c.decide(ctx, other)
	if err != nil {
		return fail("decision API, another salt: %v", err)
	}
	_, ou, err := c.send(ctx, p.SecondEndpoint+path, other)
	if err != nil {
		return fail("another salt, sent to %s: %v", p.SecondEndpoint, err)
	}
	p.OtherSaltPredicted, p.OtherSaltCached = op.MostMatched(), ou.Cached
	return p
}

// tokens renders a probe of kind on every endpoint of model and records
// the block keys of the engine's own tokens, at the model's block size,
// beside the keys the picker computes.
func (c *Collector) tokens(ctx context.Context, kind, model string, blockSize int, fleet []debugapi.Endpoint) []verify.TokenFacts {
	_, body := probeBody(kind, model, salt())
	pick, err := c.decide(ctx, body)
	if err != nil {
		return []verify.TokenFacts{{Probe: kind, PickerErr: err.Error()}}
	}
	b, _ := json.Marshal(body)
	cacheSalt, _ := body["cache_salt"].(string)
	var out []verify.TokenFacts
	for _, e := range fleet {
		if e.Model != model {
			continue
		}
		f := verify.TokenFacts{Probe: kind, Endpoint: e.Endpoint, PickerKeys: pick.Keys}
		r, err := c.rc.Render(ctx, e.Endpoint, renderKind(kind), b)
		if err != nil {
			f.RenderErr = err.Error()
			out = append(out, f)
			continue
		}
		f.Via, f.Tokens = r.Via, len(r.TokenIDs)
		for _, k := range (&blockkey.Request{Tokens: r.TokenIDs, CacheSalt: cacheSalt}).AppendKeys(nil, model, cmp.Or(blockSize, e.BlockSize)) {
			f.EngineKeys = append(f.EngineKeys, k.String())
		}
		out = append(out, f)
	}
	return out
}

// renderKind is the request kind of a probe.
func renderKind(kind string) intake.Kind {
	switch kind {
	case "chat":
		return intake.Chat
	case "completion":
		return intake.Completion
	default:
		return intake.Responses
	}
}

// probeText is n sentences of fixed text, distinct per tag.
func probeText(tag string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "Verification %s sentence %d checks that routing keys and engine caches agree on every token. ", tag, i)
	}
	return b.String()
}

// probeBody is the probe request of kind, and its path: a chat with tools,
// a text completion, or a Responses request with instructions, a function
// call and its output.
func probeBody(kind, model, cacheSalt string) (string, map[string]any) {
	tool := map[string]any{"type": "function", "function": map[string]any{"name": "lookup_order", "description": "Look an order up by id.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"}}, "required": []string{"id"}}}}
	switch kind {
	case "chat":
		return "/v1/chat/completions", map[string]any{"model": model, "max_tokens": 1, "cache_salt": cacheSalt, "tools": []any{tool},
			"messages": []any{
				map[string]any{"role": "system", "content": probeText("system", 8)},
				map[string]any{"role": "user", "content": probeText("user", 4)},
			}}
	case "completion":
		return "/v1/completions", map[string]any{"model": model, "max_tokens": 1, "cache_salt": cacheSalt, "prompt": probeText("completion", 12)}
	default:
		fn := tool["function"].(map[string]any)
		return "/v1/responses", map[string]any{"model": model, "max_output_tokens": 1, "cache_salt": cacheSalt, "store": false,
			"instructions": probeText("instructions", 8),
			"tools":        []any{map[string]any{"type": "function", "name": fn["name"], "description": fn["description"], "parameters": fn["parameters"]}},
			"input": []any{
				map[string]any{"role": "user", "content": probeText("question", 3)},
				map[string]any{"type": "function_call", "call_id": "call_verify_1", "name": "lookup_order", "arguments": `{"id":"A-1"}`},
				map[string]any{"type": "function_call_output", "call_id": "call_verify_1", "output": probeText("tool-output", 3)},
			}}
	}
}
