package verify

import (
	"fmt"
	"slices"

	"github.com/kvroute/kvroute/internal/debugapi"
)

// SidecarFacts is what verify saw of an endpoint's sidecar debug server.
type SidecarFacts struct {
	Endpoint string // the endpoint whose sidecar it is
	// DebugURL is the sidecar's advertised debug base URL ("" unknown: not
	// asked).
	DebugURL string
	// Err, when set, is why its /debug/state could not be read.
	Err string
	// Follows are the endpoints the sidecar answering there follows.
	Follows []string
	// GossipInsecure: that sidecar gossips without a keyring off loopback
	// (--gossip-insecure).
	GossipInsecure bool
}

// JudgeSidecar checks the endpoint's sidecar answers on its debug URL and
// is that endpoint's (a loopback URL may reach another one).
func JudgeSidecar(f SidecarFacts) Check {
	c := Check{Name: "sidecar reachable", Endpoint: f.Endpoint}
	switch {
	case f.DebugURL == "":
		c.Detail = "the sidecar's debug URL is unknown"
		c.Cause = "the sidecar listens for debug on every interface without a known address: set --admin-advertise (or --gossip-advertise)"
	case f.Err != "":
		c.Detail, c.Cause = f.Err, "the sidecar's debug port is not reachable from here (network policy, --admin-listen on loopback, or the sidecar is down)"
	case !slices.Contains(f.Follows, f.Endpoint):
		c.Detail = "the sidecar at " + f.DebugURL + " follows other endpoints"
		c.Cause = "its advertised debug URL reaches another sidecar (a loopback address?): set --admin-advertise to the pod's address"
	default:
		c.OK, c.Detail = true, "debug endpoints answer at "+f.DebugURL
	}
	return c
}

// JudgeGossip checks the endpoint's sidecar does not gossip unencrypted
// off loopback: there anyone who reaches the gossip port joins the fleet
// and may advertise endpoints the pickers send prompts to. A sidecar not
// read passes (JudgeSidecar fails it).
func JudgeGossip(f SidecarFacts) Check {
	c := Check{Name: "gossip encrypted", Endpoint: f.Endpoint, OK: true, Detail: "the sidecar's gossip is encrypted or on loopback"}
	switch {
	case f.DebugURL == "" || f.Err != "":
		c.Detail = "the sidecar's state was not read"
	case f.GossipInsecure:
		c.OK, c.Detail = false, "the sidecar gossips without a keyring off loopback (--gossip-insecure)"
		c.Cause = "anyone who reaches its gossip port can join and advertise endpoints: give every member --gossip-key-file"
	}
	return c
}

// DetailsFacts is a short prompt sent twice straight to an engine: the
// second answer's usage.
type DetailsFacts struct {
	Endpoint string
	// Err, when set, is why the engine did not answer.
	Err          string
	PromptTokens int
	CachedTokens int
	Details      bool // the usage had prompt_tokens_details (or input_tokens_details)
}

// JudgeCachedDetails checks the engine reports cached tokens: without
// them no outcome can be measured.
func JudgeCachedDetails(f DetailsFacts) Check {
	c := Check{Name: "engine reports cached tokens", Endpoint: f.Endpoint}
	switch {
	case f.Err != "":
		c.Detail, c.Cause = f.Err, "the engine did not answer a completion"
	case !f.Details:
		c.Detail = fmt.Sprintf("a repeated %d-token prompt came back without prompt_tokens_details", f.PromptTokens)
		c.Cause = "the engine runs without --enable-prompt-tokens-details: no outcome can be measured"
	default:
		c.OK, c.Detail = true, fmt.Sprintf("a repeated %d-token prompt reported %d cached", f.PromptTokens, f.CachedTokens)
	}
	return c
}

// TokenFacts is one endpoint's own rendering of a probe, against the
// picker's block keys for it.
type TokenFacts struct {
	Probe string // chat, completion, responses
	// PickerErr, when set, is why the picker's keys could not be had (the
	// decision API failed); nothing was rendered, and Endpoint is "".
	PickerErr string
	Endpoint  string
	// RenderErr, when set, is why the engine could not render the probe.
	RenderErr string
	Via       string // how the engine rendered it, e.g. "chat/completions render"
	Tokens    int    // the engine's prompt tokens
	// EngineKeys are the block keys of the engine's tokens at the model's
	// block size (a block size that differs is the identity check's);
	// PickerKeys the picker's, both canonical.
	EngineKeys, PickerKeys []string
}

// JudgeTokenParity checks an endpoint's tokens for a probe give the
// picker's keys: an endpoint with another tokenizer or chat template
// differs here even when no request reaches it.
func JudgeTokenParity(f TokenFacts) Check {
	c := Check{Name: "probe " + f.Probe + " tokens", Endpoint: f.Endpoint}
	switch {
	case f.PickerErr != "":
		c.Detail, c.Cause = "decision API: "+f.PickerErr, "the picker could not compute the probe's keys"
		return c
	case f.RenderErr != "":
		c.Detail, c.Cause = f.RenderErr, "the engine could not render the probe (render endpoints missing or failing)"
		return c
	}
	same := 0
	for same < min(len(f.EngineKeys), len(f.PickerKeys)) && f.EngineKeys[same] == f.PickerKeys[same] {
		same++
	}
	c.OK = same == len(f.EngineKeys) && same == len(f.PickerKeys) && same > 0
	c.Detail = fmt.Sprintf("the engine's tokens (%s, %d tokens) give %d block keys; the picker's %d; the first %d agree",
		f.Via, f.Tokens, len(f.EngineKeys), len(f.PickerKeys), same)
	if !c.OK {
		c.Cause = "this engine tokenizes or templates the probe differently from the engine the picker renders with (tokenizer, revision, chat template, block size): its cached blocks can never match"
	}
	return c
}

// FindEndpoint finds url among fleet's endpoints.
func FindEndpoint(fleet []debugapi.Endpoint, url string) (debugapi.Endpoint, bool) {
	i := slices.IndexFunc(fleet, func(e debugapi.Endpoint) bool { return e.Endpoint == url })
	if i < 0 {
		return debugapi.Endpoint{}, false
	}
	return fleet[i], true
}

// ProbeTarget is the endpoint the picker sent a probe of model to, or why
// the probe cannot go on there: an endpoint the picker does not list, or
// one serving another model.
func ProbeTarget(fleet []debugapi.Endpoint, url, model string) (debugapi.Endpoint, error) {
	e, ok := FindEndpoint(fleet, url)
	switch {
	case !ok:
		return e, fmt.Errorf("the picker sent the probe to %q, which its /debug/endpoints does not list", url)
	case e.Model != model:
		return e, fmt.Errorf("the picker sent a %s probe to %s, which serves %s", model, url, e.Model)
	}
	return e, nil
}
