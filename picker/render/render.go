package render

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/picker/intake"
)

// Via names how tokens were obtained (a metric label).
const (
	ViaChatRender        = "chat_render"
	ViaCompletionsRender = "completions_render"
	ViaResponsesRender   = "responses_render"
	ViaResponsesAsChat   = "responses_as_chat" // no Responses render: mapped to chat messages
	ViaTokenize          = "tokenize"
)

// Rendered is a request's tokens as the engine will see them.
type Rendered struct {
	TokenIDs  []uint32
	CacheSalt string // as echoed by render ("" when none or not echoed)
	MM        []blockkey.MMItem
	Via       string
}

// RefusedError is an engine's 4xx answer.
type RefusedError struct {
	Status int
	Body   []byte
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("engine refused the request (%d): %.200s", e.Status, e.Body)
}

// Client renders requests. The zero value is not usable; use New.
type Client struct {
	hc      *http.Client
	maxBody int64
	apiKey  atomic.Pointer[string] // "" or unset: none
}

// WithAPIKey makes every call carry "Authorization: Bearer key", for
// engines started with --api-key.
func (c *Client) WithAPIKey(key string) *Client {
	c.SetAPIKey(key)
	return c
}

// SetAPIKey replaces the key calls carry (a rotated key); calls in
// flight keep the one they started with.
func (c *Client) SetAPIKey(key string) { c.apiKey.Store(&key) }

// New returns a client whose calls take at most timeout and read at most
// maxBody bytes of an answer.
func New(timeout time.Duration, maxBody int64) *Client {
	tr := &http.Transport{
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Client{hc: &http.Client{Timeout: timeout, Transport: tr}, maxBody: maxBody}
}

// Close drops pooled connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// errNotFound marks an endpoint the engine does not serve.
var errNotFound = errors.New("render: endpoint not served")

// Render returns the tokens of body, a request of kind, from the engine at
// base (its HTTP base URL).
func (c *Client) Render(ctx context.Context, base string, kind intake.Kind, body []byte) (Rendered, error) {
	switch kind {
	case intake.Chat:
		r, err := c.generate(ctx, base+"/v1/chat/completions/render", body, false)
		if errors.Is(err, errNotFound) {
			return c.tokenize(ctx, base, body)
		}
		r.Via = ViaChatRender
		return r, err
	case intake.Completion:
		r, err := c.generate(ctx, base+"/v1/completions/render", body, true)
		if errors.Is(err, errNotFound) {
			return c.tokenize(ctx, base, body)
		}
		r.Via = ViaCompletionsRender
		return r, err
	case intake.Responses:
		r, err := c.generate(ctx, base+"/v1/responses/render", body, false)
		if !errors.Is(err, errNotFound) {
			r.Via = ViaResponsesRender
			return r, err
		}
		chat, err := ResponsesAsChat(body)
		if err != nil {
			return Rendered{}, err
		}
		r, err = c.generate(ctx, base+"/v1/chat/completions/render", chat, false)
		if errors.Is(err, errNotFound) {
			r, err = c.tokenize(ctx, base, chat)
		}
		r.Via = ViaResponsesAsChat
		return r, err
	}
	return Rendered{}, fmt.Errorf("render: nothing to render for a %s body", kind)
}

// generateRequest is the part of vLLM's GenerateRequest routing needs.
type generateRequest struct {
	TokenIDs  []uint32 `json:"token_ids"`
	CacheSalt *string  `json:"cache_salt"`
	Features  *struct {
		MMHashes       json.RawMessage `json:"mm_hashes"`
		MMPlaceholders json.RawMessage `json:"mm_placeholders"`
	} `json:"features"`
}

func (c *Client) generate(ctx context.Context, url string, body []byte, list bool) (Rendered, error) {
	raw, err := c.post(ctx, url, body)
	if err != nil {
		return Rendered{}, err
	}
	var g generateRequest
	if list { // /v1/completions/render answers a list, one per prompt
		var gs []generateRequest
		if err := json.Unmarshal(raw, &gs); err != nil || len(gs) != 1 {
			return Rendered{}, fmt.Errorf("render: %s answered %d requests, want one (%v)", url, len(gs), err)
		}
		g = gs[0]
	} else if err := json.Unmarshal(raw, &g); err != nil {
		return Rendered{}, fmt.Errorf("render: %s: %w", url, err)
	}
	r := Rendered{TokenIDs: g.TokenIDs}
	if g.CacheSalt != nil {
		r.CacheSalt = *g.CacheSalt
	}
	if g.Features != nil {
		if r.MM, err = mmItems(g.Features.MMHashes, g.Features.MMPlaceholders, len(g.TokenIDs)); err != nil {
			return Rendered{}, fmt.Errorf("render: %s: %w", url, err)
		}
	}
	return r, nil
}

// mmItems pairs vLLM's multimodal features: mm_hashes and mm_placeholders
// are maps from modality to lists (or plain lists), in the same order.
func mmItems(hashes, placeholders json.RawMessage, ntok int) ([]blockkey.MMItem, error) {
	if len(hashes) == 0 || string(hashes) == "null" {
		return nil, nil
	}
	type ph struct {
		Offset int `json:"offset"`
		Length int `json:"length"`
	}
	var hs map[string][]string
	var ps map[string][]ph
	if json.Unmarshal(hashes, &hs) != nil {
		var l []string
		if err := json.Unmarshal(hashes, &l); err != nil {
			return nil, fmt.Errorf("mm_hashes: %w", err)
		}
		hs = map[string][]string{"": l}
		var pl []ph
		if err := json.Unmarshal(placeholders, &pl); err != nil {
			return nil, fmt.Errorf("mm_placeholders: %w", err)
		}
		ps = map[string][]ph{"": pl}
	} else if err := json.Unmarshal(placeholders, &ps); err != nil {
		return nil, fmt.Errorf("mm_placeholders: %w", err)
	}
	var out []blockkey.MMItem
	for mod, h := range hs {
		p := ps[mod]
		if len(p) != len(h) {
			return nil, fmt.Errorf("%d %q hashes for %d placeholders", len(h), mod, len(p))
		}
		for i := range h {
			if p[i].Offset < 0 || p[i].Length < 0 || p[i].Offset+p[i].Length > ntok {
				return nil, fmt.Errorf("placeholder %d+%d outside %d tokens", p[i].Offset, p[i].Length, ntok)
			}
			out = append(out, blockkey.MMItem{Identifier: h[i], Offset: p[i].Offset, Length: p[i].Length})
		}
	}
	sortMM(out)
	return out, nil
}

func sortMM(items []blockkey.MMItem) {
	for i := 1; i < len(items); i++ {
		for j := i; j > 0 && items[j].Offset < items[j-1].Offset; j-- {
			items[j], items[j-1] = items[j-1], items[j]
		}
	}
}

// tokenize is the last resort: /tokenize with the chat or completion form
// (it ignores cache_salt and never echoes it).
// ErrMultimodalTokenize refuses the /tokenize fallback for a request with
// media: /tokenize returns no multimodal features, and keys without them
// would claim matches the engine does not have.
var ErrMultimodalTokenize = errors.New("render: no render endpoint, and /tokenize cannot identify this request's media")

// hasMedia reports whether a chat body has a content part that is not
// text.
func hasMedia(body []byte) bool {
	var req struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return false
	}
	for _, m := range req.Messages {
		var parts []struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(m.Content, &parts) != nil {
			continue // a string
		}
		for _, p := range parts {
			if p.Type != "text" {
				return true
			}
		}
	}
	return false
}

func (c *Client) tokenize(ctx context.Context, base string, body []byte) (Rendered, error) {
	if hasMedia(body) {
		return Rendered{}, ErrMultimodalTokenize
	}
	raw, err := c.post(ctx, base+"/tokenize", body)
	if err != nil {
		return Rendered{}, err
	}
	var t struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return Rendered{}, fmt.Errorf("render: /tokenize: %w", err)
	}
	return Rendered{TokenIDs: t.Tokens, Via: ViaTokenize}, nil
}

func (c *Client) post(ctx context.Context, url string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if k := c.apiKey.Load(); k != nil && *k != "" {
		req.Header.Set("Authorization", "Bearer "+*k)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody+1))
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) > c.maxBody {
		return nil, fmt.Errorf("render: %s answered more than %d bytes", url, c.maxBody)
	}
	switch {
	case (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed) && !modelError(raw):
		return nil, fmt.Errorf("%w: %s", errNotFound, url) // no such route (an unknown model is a refusal)
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return nil, &RefusedError{Status: resp.StatusCode, Body: raw}
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("render: %s: status %d", url, resp.StatusCode)
	}
	return raw, nil
}

// modelError reports whether a 404 body is vLLM's refusal of an unknown
// model (an OpenAI error naming param "model") rather than a route the
// engine does not serve ({"detail": "Not Found"} from the web framework,
// or vLLM's HTTPException handler's {"error": {"message": "Not Found"}}).
func modelError(raw []byte) bool {
	var e struct {
		Error *struct {
			Param *string `json:"param"`
		} `json:"error"`
	}
	return json.Unmarshal(raw, &e) == nil && e.Error != nil && e.Error.Param != nil && *e.Error.Param == "model"
}
