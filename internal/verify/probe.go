package verify

import "fmt"

// ProbeResult is what one token-parity probe observed: a request sent
// twice through the picker with a fresh cache_salt, then once more with
// another salt.
type ProbeResult struct {
	Name           string `json:"name"` // chat, completion, responses
	Model          string `json:"model"`
	FirstEndpoint  string `json:"first_endpoint"`
	SecondEndpoint string `json:"second_endpoint"`
	PromptTokens   int    `json:"prompt_tokens"`
	BlockSize      int    `json:"block_size"`
	// Predicted is the picker's matched tokens for the second send;
	// EngineCached what the engine reported cached for it.
	Predicted    int `json:"predicted_cached_tokens"`
	EngineCached int `json:"engine_cached_tokens"`
	// Keys is how many block keys the picker computed for the prompt;
	// KeysIndexed how many of them the endpoint's sidecar holds.
	Keys        int `json:"keys"`
	KeysIndexed int `json:"keys_indexed"`
	// KeysError, when set, is why the keys could not be looked up.
	KeysError string `json:"keys_error,omitempty"`
	// OtherSalt* are the same prompt under another salt.
	OtherSaltPredicted int `json:"other_salt_predicted_tokens"`
	OtherSaltCached    int `json:"other_salt_engine_cached_tokens"`
	// Err, when set, is why the probe could not run to the end.
	Err string `json:"error,omitempty"`
}

// JudgeProbe turns a probe's observations into checks.
func JudgeProbe(p ProbeResult) []Check {
	name := "probe " + p.Name
	if p.Err != "" {
		return []Check{{Name: name, Endpoint: p.FirstEndpoint, Detail: p.Err,
			Cause: "the probe could not complete: is the picker routing this model, and are its engines answering?"}}
	}
	var checks []Check
	same := Check{Name: name + " same endpoint", Endpoint: p.SecondEndpoint, OK: p.FirstEndpoint == p.SecondEndpoint,
		Detail: fmt.Sprintf("first send on %s, second on %s", p.FirstEndpoint, p.SecondEndpoint)}
	if !same.OK {
		same.Cause = "the picker did not see the first send's blocks on its endpoint (events not reaching the sidecar, keys that do not match, or a load override)"
	}
	checks = append(checks, same)

	// vLLM never reports the prompt's last token cached: compare at block
	// granularity below that bound.
	bound := FullBlockTokens(p.PromptTokens, p.BlockSize)
	pred, eng := min(p.Predicted, bound), min(p.EngineCached, bound)
	if p.BlockSize > 0 {
		pred, eng = pred/p.BlockSize*p.BlockSize, eng/p.BlockSize*p.BlockSize
	}
	pc := Check{Name: name + " prediction", Endpoint: p.SecondEndpoint, OK: pred == eng && eng > 0,
		Detail: fmt.Sprintf("predicted %d cached tokens, the engine reported %d (of %d prompt tokens, blocks of %d)", p.Predicted, p.EngineCached, p.PromptTokens, p.BlockSize)}
	switch {
	case pc.OK:
	case eng == 0:
		pc.Cause = "the engine cached nothing of a prompt it had just served: prefix caching off, or the engine lacks --enable-prompt-tokens-details (no cached-token counts)"
	case pred < eng:
		pc.Cause = "the picker predicted less than the engine holds: KV events lost or late (sidecar partial, stale, or not receiving), or keys that differ (block size, hash seed, tokenizer or template)"
	default:
		pc.Cause = "the picker predicted more than the engine holds: blocks evicted between the sends, or keys that collide across what the engine keeps apart"
	}
	checks = append(checks, pc)

	kc := Check{Name: name + " keys on sidecar", Endpoint: p.SecondEndpoint, OK: p.KeysError == "" && p.Keys > 0 && p.KeysIndexed == p.Keys,
		Detail: fmt.Sprintf("%d of the picker's %d block keys are in the endpoint's sidecar index", p.KeysIndexed, p.Keys)}
	switch {
	case p.KeysError != "":
		kc.Detail = "could not look the keys up: " + p.KeysError
		kc.Cause = "the endpoint's sidecar debug endpoints are not reachable from here (--admin-advertise, network policy, or an older sidecar)"
	case !kc.OK:
		kc.Cause = "the picker's tokens differ from the engine's (tokenizer, chat template, Responses rendering), or the sidecar has not indexed the engine's events"
	}
	checks = append(checks, kc)

	oc := Check{Name: name + " other salt", Endpoint: p.SecondEndpoint, OK: p.OtherSaltPredicted == 0 && p.OtherSaltCached == 0,
		Detail: fmt.Sprintf("another cache_salt: predicted %d, the engine reported %d cached tokens", p.OtherSaltPredicted, p.OtherSaltCached)}
	if !oc.OK {
		oc.Cause = "cache_salt does not separate tenants: keys or engine hashes ignore it"
	}
	return append(checks, oc)
}
