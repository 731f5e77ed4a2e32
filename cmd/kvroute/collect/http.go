package collect

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/picker/pickapi"
)

// post sends body as JSON to u, with the decision API's token when auth,
// and returns the answer's headers and body (up to 4 MiB). A status other
// than 200 is an *openai.StatusError, named after u when named.
func (c *Collector) post(ctx context.Context, u, named string, body map[string]any, auth bool) (http.Header, []byte, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if auth && c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, nil, openai.NewStatusError(named, resp.StatusCode, raw)
	}
	return resp.Header, raw, nil
}

// send posts body (non-streaming) to u and returns the answer's headers
// and usage.
func (c *Collector) send(ctx context.Context, u string, body map[string]any) (http.Header, openai.Usage, error) {
	h, raw, err := c.post(ctx, u, u, body, false)
	if err != nil {
		return nil, openai.Usage{}, err
	}
	us, err := openai.DecodeUsage(raw)
	if err != nil {
		return nil, openai.Usage{}, fmt.Errorf("%s: %w", u, err)
	}
	return h, us, nil
}

// decide asks the decision API, explained, for body.
func (c *Collector) decide(ctx context.Context, body map[string]any) (pickapi.Answer, error) {
	var a pickapi.Answer
	_, raw, err := c.post(ctx, c.picker+pickapi.Path+"?explain=true", "", body, true)
	if err != nil {
		return a, err
	}
	return a, json.Unmarshal(raw, &a)
}

// getJSON decodes the JSON at u into out. A status other than 200 is an
// *openai.StatusError naming u (its body left out).
func (c *Collector) getJSON(ctx context.Context, u string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return openai.NewStatusError(u, resp.StatusCode, nil)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out)
}

// indexed asks the endpoint's sidecar whether it holds key.
func (c *Collector) indexed(ctx context.Context, e debugapi.Endpoint, key string) (bool, error) {
	var res struct {
		Indexed bool `json:"indexed"`
	}
	q := url.Values{"canonical": {key}, "rank": {strconv.Itoa(e.Rank)}}
	err := c.getJSON(ctx, e.SidecarDebug+"/debug/keys?"+q.Encode(), &res)
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

// salt is a fresh random cache_salt.
func salt() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "kvroute-verify-" + hex.EncodeToString(b)
}
