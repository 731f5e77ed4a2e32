package openai

import "encoding/json"

// Usage is what a response reports of its prompt.
type Usage struct {
	Prompt  int  // prompt_tokens, or input_tokens (Responses)
	Cached  int  // the details' cached_tokens
	Details bool // prompt_tokens_details (or input_tokens_details) present
	Seen    bool // a usage with prompt_tokens or input_tokens was found
}

// usageJSON is usage on the wire, both forms.
type usageJSON struct {
	PromptTokens        *int     `json:"prompt_tokens"`
	InputTokens         *int     `json:"input_tokens"`
	PromptTokensDetails *details `json:"prompt_tokens_details"`
	InputTokensDetails  *details `json:"input_tokens_details"`
}

type details struct {
	CachedTokens int `json:"cached_tokens"`
}

func (u *usageJSON) usage() Usage {
	if u == nil {
		return Usage{}
	}
	out := Usage{Seen: true}
	switch {
	case u.PromptTokens != nil:
		out.Prompt = *u.PromptTokens
	case u.InputTokens != nil:
		out.Prompt = *u.InputTokens
	default:
		return Usage{}
	}
	switch {
	case u.PromptTokensDetails != nil:
		out.Cached, out.Details = u.PromptTokensDetails.CachedTokens, true
	case u.InputTokensDetails != nil:
		out.Cached, out.Details = u.InputTokensDetails.CachedTokens, true
	}
	return out
}

// UsageOf finds the usage in a JSON body or one SSE event's data: at the
// top level (chat, completions, their final stream chunk) or inside
// "response" (a Responses object, response.completed events). Anything
// else gives the zero Usage.
func UsageOf(b []byte) Usage {
	u, _ := DecodeUsage(b)
	return u
}

// DecodeUsage is UsageOf for a body that must be JSON: it also returns
// the error when b is not.
func DecodeUsage(b []byte) (Usage, error) {
	var v struct {
		Usage    *usageJSON `json:"usage"`
		Response *struct {
			Usage *usageJSON `json:"usage"`
		} `json:"response"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return Usage{}, err
	}
	switch {
	case v.Usage != nil:
		return v.Usage.usage(), nil
	case v.Response != nil:
		return v.Response.Usage.usage(), nil
	}
	return Usage{}, nil
}
