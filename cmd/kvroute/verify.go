package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/verify"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/render"
)

// verifyReport is verify's result (--json prints it).
type verifyReport struct {
	Picker string                `json:"picker"`
	Groups []verify.Group        `json:"groups"`
	Probes []verify.ProbeResult  `json:"probes"`
	Checks []verify.Check        `json:"checks"`
	OK     bool                  `json:"ok"`
	Fleet  []verifyEndpointState `json:"endpoints"`
}

// verifyEndpointState is an endpoint as the picker reports it, with its
// sidecar's debug URL.
type verifyEndpointState struct {
	verify.Endpoint
	SidecarDebug string `json:"sidecar_debug"`
}

// verifier gathers the facts over HTTP.
type verifier struct {
	picker string
	hc     *http.Client
	token  string         // the decision API's bearer token, if any
	settle time.Duration  // longest wait for a probe's blocks to reach its sidecar
	rc     *render.Client // engines' own tokens, as the picker gets them
}

// probeKinds are the probes' request kinds.
var probeKinds = map[string]intake.Kind{"chat": intake.Chat, "completion": intake.Completion, "responses": intake.Responses}

func newVerifyCommand() *cobra.Command {
	var picker, model, tokenFile string
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "verify --picker URL",
		Short: "Check a fleet's compatibility and token parity",
		Long: `Check, through a picker, that the fleet's endpoints agree on what routing
keys depend on, and that the picker's predictions match what the engines
actually cache:

  - identity: per model, every endpoint's block size, hash algorithm, key
    format, summary parameters and tokenizer fingerprint against the
    model's majority; sidecars stale, partial or unreachable; engines that
    do not report cached tokens (--enable-prompt-tokens-details);
  - token parity: a chat request with tools, a text completion and a
    Responses request (instructions, a function call and its output), each
    sent twice with a fresh cache_salt: the second must go where the first
    went, the picker's predicted cached tokens must equal the engine's, the
    picker's block keys must be on that endpoint's sidecar, and another
    salt must share nothing; and each probe rendered by every endpoint of
    the model must give the picker's block keys (another tokenizer or chat
    template shows here even when the picker routes nothing to it).

Probes send small requests (a few hundred tokens, one output token) to the
engines, directly and through the picker. Exit status: 0 when every check
passed, 1 when one failed, 2 when verify could not run (picker unreachable,
bad flags).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if picker == "" {
				return usageError(errors.New("--picker URL is required (the picker's HTTP base URL)"))
			}
			u, err := url.Parse(picker)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usageError(fmt.Errorf("--picker %q: want http://host:port", picker))
			}
			if timeout <= 0 {
				return usageError(fmt.Errorf("--timeout %v: want > 0", timeout))
			}
			v := &verifier{picker: strings.TrimRight(picker, "/"), hc: &http.Client{Timeout: timeout}, settle: timeout,
				rc: render.New(timeout, 16<<20)}
			defer v.rc.Close()
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return usageError(fmt.Errorf("--decision-token-file: %w", err))
				}
				v.token = strings.TrimSpace(string(b))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*timeout)
			defer cancel()
			rep, err := v.run(ctx, model)
			if err == nil && ctx.Err() != nil {
				err = fmt.Errorf("ran out of time (10 × --timeout %v): raise --timeout", timeout)
			}
			if err != nil {
				return &exitCodeError{code: exitUsage, err: err} // verify itself could not run
			}
			w := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printVerify(w, rep)
			}
			if !rep.OK {
				return &exitCodeError{code: exitError, err: errors.New(verify.Summary(rep.Checks))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&picker, "picker", "", "the picker's HTTP base URL, e.g. http://kvroute-picker:8080")
	f.StringVar(&model, "model", "", "check only this model (default: every model the picker routes)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "bound on each request")
	f.StringVar(&tokenFile, "decision-token-file", "", "file holding the picker's decision API token, if it needs one")
	return cmd
}

// run gathers the facts and judges them; an error means verify could not
// run at all.
func (v *verifier) run(ctx context.Context, model string) (*verifyReport, error) {
	var dbg struct {
		Endpoints []verifyEndpointState `json:"endpoints"`
		Refused   []struct {
			Endpoint, Sidecar, Reason, Model string
			SummaryParams                    string `json:"summary_params"`
		} `json:"refused"`
	}
	if err := v.getJSON(ctx, v.picker+"/debug/endpoints", &dbg); err != nil {
		return nil, fmt.Errorf("the picker's endpoints: %w", err)
	}
	rep := &verifyReport{Picker: v.picker}
	var eps []verify.Endpoint
	for _, e := range dbg.Endpoints {
		if model == "" || e.Model == model {
			rep.Fleet = append(rep.Fleet, e)
			eps = append(eps, e.Endpoint)
		}
	}
	if len(eps) == 0 && model != "" {
		return nil, fmt.Errorf("the picker at %s knows no endpoint serving %s", v.picker, model)
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("the picker at %s knows no endpoint", v.picker)
	}
	// The decision API may want a token the OpenAI endpoints do not.
	_, probe := probeBody("completion", eps[0].Model, salt())
	var pre map[string]any
	if err := v.decide(ctx, probe, &pre); err != nil {
		if strings.Contains(err.Error(), "status 401") {
			return nil, fmt.Errorf("the picker's decision API wants a token: --decision-token-file")
		}
		return nil, fmt.Errorf("the picker's decision API: %w", err)
	}
	rep.Groups, rep.Checks = verify.Consistency(eps, verify.DefaultMaxStale)
	for _, rf := range dbg.Refused {
		if model != "" && rf.Model != model {
			continue
		}
		rep.Checks = append(rep.Checks, verify.Refused(rf.Endpoint, rf.Reason, rf.SummaryParams))
	}
	for _, e := range rep.Fleet {
		rep.Checks = append(rep.Checks, v.sidecarReachable(ctx, e), v.cachedDetails(ctx, e))
	}
	for _, g := range rep.Groups {
		for _, kind := range []string{"chat", "completion", "responses"} {
			p := v.probe(ctx, kind, g.Model, rep.Fleet)
			rep.Probes = append(rep.Probes, p)
			rep.Checks = append(rep.Checks, verify.JudgeProbe(p)...)
			bs, _ := strconv.Atoi(g.Values["block_size"]) // the model's majority block size
			rep.Checks = append(rep.Checks, v.tokenParity(ctx, kind, g.Model, bs, rep.Fleet)...)
		}
	}
	rep.OK = len(verify.Failed(rep.Checks)) == 0
	return rep, nil
}

// sidecarState is the part of a sidecar's /debug/state verify reads.
type sidecarState struct {
	Identity struct {
		Endpoint string `json:"endpoint"`
	} `json:"identity"`
}

// sidecarReachable checks the endpoint's sidecar answers on its debug URL,
// and is that endpoint's.
func (v *verifier) sidecarReachable(ctx context.Context, e verifyEndpointState) verify.Check {
	c := verify.Check{Name: "sidecar reachable", Endpoint: e.Endpoint.Endpoint}
	if e.SidecarDebug == "" {
		c.Detail = "the sidecar's debug URL is unknown"
		c.Cause = "the sidecar listens for debug on every interface without a known address: set --debug-advertise (or --gossip-advertise)"
		return c
	}
	var state []sidecarState
	if err := v.getJSON(ctx, e.SidecarDebug+"/debug/state", &state); err != nil {
		c.Detail, c.Cause = err.Error(), "the sidecar's debug port is not reachable from here (network policy, --debug-listen on loopback, or the sidecar is down)"
		return c
	}
	// The sidecar answering must be this endpoint's (a loopback URL may
	// reach another one).
	if !slices.ContainsFunc(state, func(s sidecarState) bool { return s.Identity.Endpoint == e.Endpoint.Endpoint }) {
		c.Detail = "the sidecar at " + e.SidecarDebug + " follows other endpoints"
		c.Cause = "its advertised debug URL reaches another sidecar (a loopback address?): set --debug-advertise to the pod's address"
		return c
	}
	c.OK, c.Detail = true, "debug endpoints answer at "+e.SidecarDebug
	return c
}

// cachedDetails sends a short completion twice straight to the engine and
// checks the second reports its cached tokens.
func (v *verifier) cachedDetails(ctx context.Context, e verifyEndpointState) verify.Check {
	c := verify.Check{Name: "engine reports cached tokens", Endpoint: e.Endpoint.Endpoint}
	body := map[string]any{"model": e.Model, "prompt": probeText("details", 8), "max_tokens": 1, "cache_salt": salt()}
	var u usage
	for i := 0; i < 2; i++ {
		var err error
		if _, u, err = v.send(ctx, e.Endpoint.Endpoint+"/v1/completions", body); err != nil {
			c.Detail, c.Cause = err.Error(), "the engine did not answer a completion"
			return c
		}
	}
	if !u.details {
		c.Detail = fmt.Sprintf("a repeated %d-token prompt came back without prompt_tokens_details", u.prompt)
		c.Cause = "the engine runs without --enable-prompt-tokens-details: no outcome can be measured"
		return c
	}
	c.OK, c.Detail = true, fmt.Sprintf("a repeated %d-token prompt reported %d cached", u.prompt, u.cached)
	return c
}

// probe runs one token-parity probe of kind for model through the picker.
func (v *verifier) probe(ctx context.Context, kind, model string, fleet []verifyEndpointState) verify.ProbeResult {
	p := verify.ProbeResult{Name: kind, Model: model}
	path, body := probeBody(kind, model, salt())
	fail := func(format string, args ...any) verify.ProbeResult {
		p.Err = fmt.Sprintf(format, args...)
		return p
	}
	h, u, err := v.send(ctx, v.picker+path, body)
	if err != nil {
		return fail("first send: %v", err)
	}
	p.FirstEndpoint = h.Get("X-Kvroute-Endpoint")
	// The picker's keys for the prompt (one explained decision: polling the
	// decision API would count every poll as a request in flight).
	var pick struct {
		PromptTokens int      `json:"prompt_tokens"`
		Keys         []string `json:"keys"`
	}
	if err := v.decide(ctx, body, &pick); err != nil {
		return fail("decision API: %v", err)
	}
	// Wait until the first endpoint's sidecar holds the prompt's last key
	// (events travel engine → sidecar), then a moment for the summary to
	// reach the picker.
	first := endpointState(fleet, p.FirstEndpoint)
	if first != nil && first.SidecarDebug != "" && len(pick.Keys) > 0 {
		last := pick.Keys[len(pick.Keys)-1]
		for deadline := time.Now().Add(v.settle); ; {
			if ok, _ := v.indexed(ctx, *first, last); ok || time.Now().After(deadline) {
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
	h, u, err = v.send(ctx, v.picker+path, body)
	if err != nil {
		return fail("second send: %v", err)
	}
	p.SecondEndpoint = h.Get("X-Kvroute-Endpoint")
	p.Predicted, _ = strconv.Atoi(h.Get("X-Kvroute-Matched-Tokens"))
	p.EngineCached = u.cached
	target := endpointState(fleet, p.SecondEndpoint)
	if target == nil {
		return fail("the picker sent the probe to %q, which its /debug/endpoints does not list", p.SecondEndpoint)
	}
	if target.Model != model {
		return fail("the picker sent a %s probe to %s, which serves %s", model, p.SecondEndpoint, target.Model)
	}
	p.BlockSize = target.BlockSize
	if target.SidecarDebug == "" {
		p.KeysError = "the endpoint's sidecar debug URL is unknown (--debug-advertise)"
	}
	for _, k := range pick.Keys {
		if p.KeysError != "" {
			break
		}
		ok, err := v.indexed(ctx, *target, k)
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
	var op struct {
		MatchedTokens int `json:"matched_tokens"`
		Candidates    []struct {
			MatchedTokens int `json:"matched_tokens"`
		} `json:"candidates"`
	}
	if err := v.decide(ctx, other, &op); err != nil {
		return fail("decision API, another salt: %v", err)
	}
	for _, c := range op.Candidates {
		op.MatchedTokens = max(op.MatchedTokens, c.MatchedTokens)
	}
	_, ou, err := v.send(ctx, p.SecondEndpoint+path, other)
	if err != nil {
		return fail("another salt, sent to %s: %v", p.SecondEndpoint, err)
	}
	p.OtherSaltPredicted, p.OtherSaltCached = op.MatchedTokens, ou.cached
	return p
}

// tokenParity renders a probe on every endpoint of model and compares the
// block keys of the engine's own tokens (at the model's block size) with
// the keys the picker computes:
// an endpoint with another tokenizer or chat template differs here even
// when no request reaches it (the picker routes a model to its largest
// identity group).
func (v *verifier) tokenParity(ctx context.Context, kind, model string, blockSize int, fleet []verifyEndpointState) []verify.Check {
	_, body := probeBody(kind, model, salt())
	var pick struct {
		Keys []string `json:"keys"`
	}
	if err := v.decide(ctx, body, &pick); err != nil {
		return []verify.Check{{Name: "probe " + kind + " tokens", Detail: "decision API: " + err.Error(),
			Cause: "the picker could not compute the probe's keys"}}
	}
	var checks []verify.Check
	for _, e := range fleet {
		if e.Model != model {
			continue
		}
		c := verify.Check{Name: "probe " + kind + " tokens", Endpoint: e.Endpoint.Endpoint}
		b, _ := json.Marshal(body)
		r, err := v.rc.Render(ctx, e.Endpoint.Endpoint, probeKinds[kind], b)
		toks, via := r.TokenIDs, r.Via
		if err != nil {
			c.Detail, c.Cause = err.Error(), "the engine could not render the probe (render endpoints missing or failing)"
			checks = append(checks, c)
			continue
		}
		salt, _ := body["cache_salt"].(string)
		// Keys at the model's block size: this check is about tokens (the
		// identity check reports a block size that differs).
		keys := (&blockkey.Request{Tokens: toks, CacheSalt: salt}).AppendKeys(nil, model, cmp.Or(blockSize, e.BlockSize))
		same := 0
		for same < min(len(keys), len(pick.Keys)) && keys[same].String() == pick.Keys[same] {
			same++
		}
		c.OK = same == len(keys) && same == len(pick.Keys) && same > 0
		c.Detail = fmt.Sprintf("the engine's tokens (%s, %d tokens) give %d block keys; the picker's %d; the first %d agree", via, len(toks), len(keys), len(pick.Keys), same)
		if !c.OK {
			c.Cause = "this engine tokenizes or templates the probe differently from the engine the picker renders with (tokenizer, revision, chat template, block size): its cached blocks can never match"
		}
		checks = append(checks, c)
	}
	return checks
}

// endpointState finds an endpoint in the fleet.
func endpointState(fleet []verifyEndpointState, endpoint string) *verifyEndpointState {
	for i := range fleet {
		if fleet[i].Endpoint.Endpoint == endpoint {
			return &fleet[i]
		}
	}
	return nil
}

// indexed asks the endpoint's sidecar whether it holds key.
func (v *verifier) indexed(ctx context.Context, e verifyEndpointState, key string) (bool, error) {
	var res struct {
		Indexed bool `json:"indexed"`
	}
	q := url.Values{"canonical": {key}, "rank": {strconv.Itoa(e.Rank)}}
	err := v.getJSON(ctx, e.SidecarDebug+"/debug/keys?"+q.Encode(), &res)
	return res.Indexed, err
}

// sleep waits d; false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// usage is a response's prompt accounting.
type usage struct {
	prompt, cached int
	details        bool // prompt_tokens_details (or input_tokens_details) present
}

// send posts body (non-streaming) and returns the headers and usage.
func (v *verifier) send(ctx context.Context, u string, body map[string]any) (http.Header, usage, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		return nil, usage{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := v.hc.Do(req)
	if err != nil {
		return nil, usage{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, usage{}, fmt.Errorf("%s: status %d: %.300s", u, resp.StatusCode, bytes.TrimSpace(raw))
	}
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			InputTokens         int `json:"input_tokens"`
			PromptTokensDetails *struct {
				C int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
			InputTokensDetails *struct {
				C int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, usage{}, fmt.Errorf("%s: %w", u, err)
	}
	us := usage{prompt: max(out.Usage.PromptTokens, out.Usage.InputTokens)}
	for _, d := range []*struct {
		C int `json:"cached_tokens"`
	}{out.Usage.PromptTokensDetails, out.Usage.InputTokensDetails} {
		if d != nil {
			us.cached, us.details = d.C, true
		}
	}
	return resp.Header, us, nil
}

// decide asks the decision API, explained, for body.
func (v *verifier) decide(ctx context.Context, body map[string]any, out any) error {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, v.picker+"/routing/v1/pick?explain=true", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if v.token != "" {
		req.Header.Set("Authorization", "Bearer "+v.token)
	}
	resp, err := v.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %.300s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	return json.Unmarshal(raw, out)
}

func (v *verifier) getJSON(ctx context.Context, u string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := v.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", u, resp.StatusCode)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out)
}

// salt is a fresh random cache_salt.
func salt() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "kvroute-verify-" + hex.EncodeToString(b)
}

// probeText is n sentences of fixed text, distinct per tag.
func probeText(tag string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "Verification %s sentence %d checks that routing keys and engine caches agree on every token. ", tag, i)
	}
	return b.String()
}

// probeBody is the probe request of kind: a chat with tools, a text
// completion, or a Responses request with instructions, a function call
// and its output.
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

// printVerify writes the human report: the groups, a line per check, then
// the failures with their likely causes.
func printVerify(w io.Writer, rep *verifyReport) {
	fmt.Fprintf(w, "kvroute verify: picker %s, %d endpoint(s)\n\nidentity groups:\n", rep.Picker, len(rep.Fleet))
	for _, g := range rep.Groups {
		keys := make([]string, 0, len(g.Values))
		for k := range g.Values {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var vals []string
		for _, k := range keys {
			vals = append(vals, k+"="+g.Values[k])
		}
		fmt.Fprintf(w, "  %s: %d endpoint(s); %s\n", g.Model, len(g.Endpoints), strings.Join(vals, ", "))
	}
	fmt.Fprintln(w)
	for _, c := range rep.Checks {
		mark := "✔"
		if !c.OK {
			mark = "✘"
		}
		fmt.Fprintf(w, "%s %-40s %s\n", mark, c.Name, c.Endpoint)
	}
	if failed := verify.Failed(rep.Checks); len(failed) > 0 {
		fmt.Fprintln(w, "\nfailures:")
		for _, c := range failed {
			fmt.Fprintf(w, "✘ %s %s\n    %s\n    likely cause: %s\n", c.Name, c.Endpoint, c.Detail, c.Cause)
		}
	}
	fmt.Fprintf(w, "\n%s\n", verify.Summary(rep.Checks))
}
