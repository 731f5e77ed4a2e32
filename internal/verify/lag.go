package verify

import (
	"fmt"
	"time"
)

// DefaultMaxLag is the longest event-to-routable lag a lag probe passes
// with (kvroute verify --max-lag).
const DefaultMaxLag = time.Second

// LagResult is one lag probe of an endpoint: a prompt under a fresh
// cache_salt sent straight to its engine (not through the picker), then the
// picker's decision API polled with the same prompt until it predicts the
// prompt's blocks on that endpoint.
type LagResult struct {
	Model        string `json:"model"`
	Endpoint     string `json:"endpoint"`
	PromptTokens int    `json:"prompt_tokens"` // as the picker tokenizes the prompt
	BlockSize    int    `json:"block_size"`
	// FullTokens is what the picker must predict: the prompt's full blocks
	// below its last token (FullBlockTokens).
	FullTokens int `json:"full_block_tokens"`
	// Predicted: the picker predicted FullTokens on the endpoint, LagSecs
	// after the engine's answer came back.
	Predicted bool    `json:"predicted"`
	LagSecs   float64 `json:"lag_seconds"`
	// MostPredicted is the most tokens the picker predicted there.
	MostPredicted int `json:"most_predicted_tokens"`
	// WaitedSecs is how long verify polled after the engine's answer, and
	// Polls how many decisions it asked for.
	WaitedSecs float64 `json:"waited_seconds"`
	Polls      int     `json:"polls"`
	// PickerState and PickerReason are the endpoint's state on the picker
	// when a probe gave up ("" when not reported).
	PickerState  string `json:"picker_state,omitempty"`
	PickerReason string `json:"picker_state_reason,omitempty"`
	// Err, when set, is why the probe could not run.
	Err string `json:"error,omitempty"`
}

// FullBlockTokens is how many of a prompt's tokens an engine can report
// cached: its full blocks below its last token (vLLM never reports the
// last token cached).
func FullBlockTokens(promptTokens, blockSize int) int {
	if blockSize <= 0 || promptTokens <= 0 {
		return max(promptTokens, 0)
	}
	return (promptTokens - 1) / blockSize * blockSize
}

// LagFigure is a lag for people: "23 ms", "1.40 s".
func LagFigure(secs float64) string {
	switch {
	case secs < 0.01:
		return fmt.Sprintf("%.1f ms", secs*1000)
	case secs < 1:
		return fmt.Sprintf("%.0f ms", secs*1000)
	default:
		return fmt.Sprintf("%.2f s", secs)
	}
}

// JudgeLag checks the picker predicted a prompt's blocks on the endpoint
// that cached them within maxLag of the engine's answer.
func JudgeLag(r LagResult, maxLag time.Duration) Check {
	c := Check{Name: "probe lag", Endpoint: r.Endpoint}
	switch {
	case r.Err != "":
		c.Detail, c.Cause = r.Err, "the lag probe could not run: is the engine answering, and the picker routing this model?"
		c.Figure = "not measured"
	case !r.Predicted:
		c.Detail = fmt.Sprintf("the engine cached a %d-token prompt, but in %.1f s (%d decisions) the picker never predicted its %d tokens of full blocks there (at most %d)",
			r.PromptTokens, r.WaitedSecs, r.Polls, r.FullTokens, r.MostPredicted)
		c.Figure = "never predicted"
		switch r.PickerState {
		case "", "cached":
			c.Cause = "the engine's KV events do not reach the picker: no live events at the sidecar (see its sidecar stream check: an engine " +
				"--kv-events-config endpoint with a concrete host makes the engine connect, so the sidecar needs --kv-events-mode bind), " +
				"keys that do not match, or summaries that do not reach the picker"
		default:
			c.Cause = fmt.Sprintf("the picker holds the endpoint %q, without cache knowledge", r.PickerState)
			if r.PickerReason != "" {
				c.Cause += ": " + r.PickerReason
			}
		}
	case r.LagSecs > maxLag.Seconds():
		c.Detail = fmt.Sprintf("the picker predicted the prompt's %d tokens of full blocks %s after the engine answered: more than --max-lag %v",
			r.FullTokens, LagFigure(r.LagSecs), maxLag)
		c.Figure = LagFigure(r.LagSecs)
		c.Cause = "KV events reach the picker late: events arriving only through replay catch-ups (see the sidecar stream check), " +
			"a slow summary stream (the sidecar's --delta-interval), or an overloaded sidecar, picker or network"
	default:
		c.OK = true
		c.Detail = fmt.Sprintf("the picker predicted the prompt's %d tokens of full blocks %s after the engine answered (--max-lag %v)",
			r.FullTokens, LagFigure(r.LagSecs), maxLag)
		c.Figure = LagFigure(r.LagSecs)
	}
	return c
}
