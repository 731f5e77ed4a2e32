package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/test/workload"
)

// Outcome is one request as the client saw it.
type Outcome struct {
	Conversation int
	Turn         int // 1, 2, …
	Endpoint     string
	// PrevEndpoint is where the turn this one continues went ("" on a
	// first turn, or when that turn had no answer yet when this one was
	// sent): a continuation is a request with one, and a warm return a
	// continuation landing there too.
	PrevEndpoint string
	// Step is the load step the request belongs to (1, 2, …; 0 when the
	// scenario has no steps).
	Step int
	// Picker is the picker the request was sent to (its base URL): the
	// last one tried, when a refused connection was retried on another.
	Picker string
	// Tenant is sent as x-kvroute-tenant when set.
	Tenant string
	// Status is the answer's HTTP status (0: none came); RetryAfter
	// whether a refusal carried Retry-After.
	Status       int
	RetryAfter   bool
	PromptTokens int
	CachedTokens int
	TTFT         time.Duration // to the first streamed output
	Start, End   time.Time
	Err          error
	// Path and Body are the request as sent (for the pooled bound).
	Path string
	Body []byte
	// Tokens, when set, returns the prompt's token ids (token-id prompts
	// the scenario can regenerate); the pooled bound then needs no Body.
	Tokens func() []uint32
	// ReuseRetries is 1 when the request was sent again, on a new
	// connection, because the kept-alive one it went out on broke before
	// any byte of an answer (the picker closing it idle just as it was
	// reused): counted, not hidden (PolicyResult.ReuseRetries).
	ReuseRetries int
}

// Scenario drives a fleet.
type Scenario interface {
	Name() string
	// Fleet is the fleet the scenario is defined for: Engines and
	// GPUBlocks (and MaxModelLen where it matters); Options override.
	Fleet() FleetConfig
	// Run sends the workload through c and returns every request's
	// outcome; an error means the run itself failed.
	Run(ctx context.Context, c *Client, rng *rand.Rand) ([]Outcome, error)
}

// Client sends requests through the picker.
type Client struct {
	base string
	// pool, when set, spreads requests over several pickers (the faults
	// scenario); base is then unused.
	pool *pickerPool
	// spread, when set, sends each request to a picker drawn at random
	// (NewSpreadClient); base is then unused.
	spread *randomSpread
	hc     *http.Client
	done   func() // called after each request, when set
	// TimeScale is the engines' time scale (1 real time): scenarios wait
	// simulated durations through Wait.
	TimeScale float64
	// MaxModelLen is the engines' context length in tokens.
	MaxModelLen int
	// Engines is the fleet's engines (0: the scenario's own figure).
	Engines int

	slots chan struct{} // bounds the requests in flight

	mu     sync.Mutex
	routed map[string]int // requests answered, by endpoint
}

// Client limits: requests in flight at once (more wait for a slot before
// their clock starts), the longest a request may take (wall time), and
// the longest a connection is kept idle — below the picker's idle timeout
// (2 minutes), so that the client, not the picker, closes idle
// connections in the common case.
const (
	MaxInFlight     = 512
	RequestTimeout  = 15 * time.Minute
	IdleConnTimeout = time.Minute
)

// NewClient returns a client of the picker at base.
func NewClient(base string) *Client {
	return &Client{base: base, TimeScale: 1, routed: map[string]int{}, slots: make(chan struct{}, MaxInFlight),
		hc: &http.Client{Timeout: RequestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: MaxInFlight, IdleConnTimeout: IdleConnTimeout}}}
}

// NewSpreadClient returns a client of the pickers at bases that sends
// each request to one of them drawn at random, as a Kubernetes Service
// spreads connections over its pods: every request is drawn on its own,
// a conversation's turns included. The draws come from seed (the
// bench's), in the order the requests are sent. With one base it is
// NewClient(bases[0]).
func NewSpreadClient(bases []string, seed uint64) *Client {
	c := NewClient(bases[0])
	if len(bases) > 1 {
		c.spread = &randomSpread{bases: bases, rng: rand.New(rand.NewPCG(seed, 0x737072656164))}
	}
	return c
}

// randomSpread draws a picker at random for each request.
type randomSpread struct {
	bases []string
	mu    sync.Mutex
	rng   *rand.Rand
}

func (s *randomSpread) next() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bases[s.rng.IntN(len(s.bases))]
}

// acquire takes a slot for a request; false when ctx ended first.
func (c *Client) acquire(ctx context.Context) bool {
	select {
	case c.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *Client) release() { <-c.slots }

// Wait sleeps d of simulated time (d × TimeScale of wall time); false when
// ctx ended first.
func (c *Client) Wait(ctx context.Context, d time.Duration) bool {
	return c.WaitUntil(ctx, time.Now().Add(c.Wall(d)))
}

// Wall is simulated duration d in wall time.
func (c *Client) Wall(d time.Duration) time.Duration { return time.Duration(float64(d) * c.TimeScale) }

// WaitUntil sleeps until the wall-clock deadline; false when ctx ended
// first.
func (c *Client) WaitUntil(ctx context.Context, deadline time.Time) bool {
	d := time.Until(deadline)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Routed returns the number of requests answered by each endpoint so far.
func (c *Client) Routed() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.routed)
}

func (c *Client) count(endpoint string) {
	c.mu.Lock()
	c.routed[endpoint]++
	c.mu.Unlock()
}

// Responses sends a streaming Responses request and returns the outcome
// and the output text.
func (c *Client) Responses(ctx context.Context, body map[string]any) (Outcome, string) {
	if c.done != nil {
		defer c.done()
	}
	body["stream"] = true
	b, _ := json.Marshal(body)
	o := Outcome{Path: "/v1/responses", Body: b}
	answer := c.exchange(ctx, &o)
	return o, answer
}

// Send sends r, a streaming request to any of the three OpenAI paths, and
// returns its outcome, labelled from r (conversation, turn, step, tenant,
// the endpoint it continues, its token ids), and the answer as the
// scenario sees it.
func (c *Client) Send(ctx context.Context, r workload.Request) (Outcome, workload.Answer) {
	if c.done != nil {
		defer c.done()
	}
	o := Outcome{Conversation: r.Conversation, Turn: r.Turn, Step: r.Step, Tenant: r.Tenant, PrevEndpoint: r.Prev,
		Path: r.Path, Body: r.Body, Tokens: r.Tokens}
	text := c.exchange(ctx, &o)
	return o, workload.Answer{Endpoint: o.Endpoint, Text: text, PromptTokens: o.PromptTokens, OK: o.Err == nil}
}

// exchange streams o's request and returns the output text, reading the
// events of o.Path: response.output_text.delta and the usage of
// response.completed (/v1/responses), choices[0].delta.content
// (/v1/chat/completions) or choices[0].text (/v1/completions) and the last
// chunk's usage (include_usage). TTFT is at the first text.
func (c *Client) exchange(ctx context.Context, o *Outcome) string {
	var answer strings.Builder
	text := func(s string) {
		if s != "" && o.TTFT == 0 {
			o.TTFT = time.Since(o.Start)
		}
		answer.WriteString(s)
	}
	var event func(data string)
	switch o.Path {
	case "/v1/responses":
		event = func(data string) {
			var ev struct {
				Type  string `json:"type"`
				Delta string `json:"delta"`
			}
			if json.Unmarshal([]byte(data), &ev) != nil {
				return
			}
			switch ev.Type {
			case "response.output_text.delta":
				text(ev.Delta)
			case "response.completed":
				o.usage(openai.UsageOf([]byte(data)))
			}
		}
	case "/v1/chat/completions":
		event = func(data string) {
			var ch struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(data), &ch) != nil {
				return
			}
			if len(ch.Choices) > 0 {
				text(ch.Choices[0].Delta.Content)
			}
			if strings.Contains(data, `"usage"`) { // the last chunk's, with include_usage
				o.usage(openai.UsageOf([]byte(data)))
			}
		}
	case "/v1/completions":
		event = func(data string) {
			var ch struct {
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(data), &ch) != nil {
				return
			}
			if len(ch.Choices) > 0 {
				text(ch.Choices[0].Text)
			}
			if strings.Contains(data, `"usage"`) { // the last chunk's, with include_usage
				o.usage(openai.UsageOf([]byte(data)))
			}
		}
	default:
		o.Start = time.Now()
		o.End = o.Start
		o.Err = fmt.Errorf("path %q: want /v1/responses, /v1/chat/completions or /v1/completions", o.Path)
		return ""
	}
	c.stream(ctx, o, event)
	return answer.String()
}

// stream sends o's request (o.Path, o.Body) in a request slot, fills in
// the endpoint, times and error, and hands each server-sent event's data
// to event. A stream without usage is an error; one without text has its
// TTFT at its end.
func (c *Client) stream(ctx context.Context, o *Outcome, event func(data string)) {
	if !c.acquire(ctx) {
		o.Err = ctx.Err()
		return
	}
	defer c.release()
	o.Start = time.Now()
	defer func() {
		if o.End.IsZero() {
			o.End = time.Now() // when it failed
		}
	}()
	resp, err := c.send(ctx, o)
	if err != nil {
		o.Err = err
		return
	}
	defer resp.Body.Close()
	o.Endpoint = resp.Header.Get("X-Kvroute-Endpoint")
	o.Status, o.RetryAfter = resp.StatusCode, resp.Header.Get("Retry-After") != ""
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		o.Err = openai.NewStatusError("", resp.StatusCode, msg)
		return
	}
	c.count(o.Endpoint)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && data != "[DONE]" {
			event(data)
		}
	}
	o.End = time.Now()
	switch {
	case sc.Err() != nil:
		o.Err = sc.Err()
	case o.PromptTokens == 0:
		o.Err = fmt.Errorf("no usage in the stream")
	case o.TTFT == 0:
		o.TTFT = o.End.Sub(o.Start) // no text: the first token is the last
	}
}

// send posts o's request to the picker (o.Picker): with a pool, to the
// next ready picker, and again to the next one when the connection is
// refused — as a Service's client retries only a refused connection —
// up to twice around the pool. A request whose kept-alive connection
// broke before any byte of an answer came is sent once more, on a new
// connection (o.ReuseRetries): the server closed the idle connection as
// the client reused it, a race of keep-alive, not a failure of the
// picker's; net/http resends only idempotent requests, and these are
// POSTs.
func (c *Client) send(ctx context.Context, o *Outcome) (*http.Response, error) {
	tries := 1
	if c.pool != nil {
		tries = 2 * len(c.pool.bases)
	}
	for try := 1; ; try++ {
		o.Picker = c.base
		switch {
		case c.pool != nil:
			o.Picker = c.pool.next()
		case c.spread != nil:
			o.Picker = c.spread.next()
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.Picker+o.Path, bytes.NewReader(o.Body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		if o.Tenant != "" {
			req.Header.Set("X-Kvroute-Tenant", o.Tenant)
		}
		resp, err := c.hc.Do(req)
		if err != nil && try < tries && errors.Is(err, syscall.ECONNREFUSED) {
			c.pool.refused.Add(1)
			continue
		}
		if err != nil && o.ReuseRetries == 0 && brokenConn(ctx, err) {
			o.ReuseRetries++
			continue
		}
		return resp, err
	}
}

// brokenConn reports whether err, from a request that got no answer
// (Do returns an error only before the answer's headers), is its
// connection's end (EOF, reset, broken pipe, closed — "use of closed
// network connection" — or net/http's "server closed idle connection"),
// not the request's context: the race of a kept-alive connection the
// picker closed idle just as it was reused. No client trace tells the
// reused connection apart: an httptrace.ClientTrace on every request
// slowed the client enough, under the race detector, to move precise's
// warm returns in TestSeedConcurrent from 14 of 16 to 11.
func brokenConn(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "server closed idle connection")
}

// usage records the prompt accounting an engine reported, when it did.
func (o *Outcome) usage(u openai.Usage) {
	if !u.Seen {
		return
	}
	o.PromptTokens = u.Prompt
	if u.Details {
		o.CachedTokens = u.Cached
	}
}

// SeedContinuation is the seed run's shape in its sequential form
// (`kvroute bench --scenario seed-continuation --sequential`): two engines
// and 12 two-turn Responses conversations run one after another as
// agentic-api runs them — turn 2 carries the full rehydrated input (≈ 6.6k
// tokens), every conversation its own cache_salt. SeedConcurrent is the
// default form, many conversations at once.
type SeedContinuation struct {
	Conversations int // default 12
	OutputTokens  int // per turn; default 32
}

// Name is the scenario's name.
func (SeedContinuation) Name() string { return "seed-continuation (sequential)" }

// Fleet is the fleet the scenario is defined for: two engines.
func (SeedContinuation) Fleet() FleetConfig { return FleetConfig{Engines: 2, GPUBlocks: 2048} }

// Run sends the conversations.
func (s SeedContinuation) Run(ctx context.Context, c *Client, rng *rand.Rand) ([]Outcome, error) {
	n, out := s.Conversations, s.OutputTokens
	if n == 0 {
		n = 12
	}
	if out == 0 {
		out = 32
	}
	var outcomes []Outcome
	for conv := 0; conv < n; conv++ {
		instructions := workload.Text(rng, 5800)
		input := []any{map[string]any{"role": "user", "content": workload.Text(rng, 700)}}
		salt := fmt.Sprintf("conversation-%d-%x", conv, rng.Uint64())
		body := func() map[string]any {
			return map[string]any{"model": "Qwen/Qwen3-0.6B", "instructions": instructions, "input": input,
				"max_output_tokens": out, "cache_salt": salt}
		}
		o1, answer := c.Responses(ctx, body())
		o1.Conversation, o1.Turn = conv, 1
		outcomes = append(outcomes, o1)
		if o1.Err != nil {
			return outcomes, fmt.Errorf("conversation %d turn 1: %w", conv, o1.Err)
		}
		input = append(input,
			map[string]any{"role": "assistant", "content": answer},
			map[string]any{"role": "user", "content": workload.Text(rng, 40)}) // a short follow-up, as in the seed run
		o2, _ := c.Responses(ctx, body())
		o2.Conversation, o2.Turn, o2.PrevEndpoint = conv, 2, o1.Endpoint
		outcomes = append(outcomes, o2)
		if o2.Err != nil {
			return outcomes, fmt.Errorf("conversation %d turn 2: %w", conv, o2.Err)
		}
	}
	return outcomes, nil
}

// Completions sends a streaming completion (prompt text or token ids),
// asking for usage in the last chunk, and returns the outcome.
func (c *Client) Completions(ctx context.Context, body map[string]any) Outcome {
	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	b, _ := json.Marshal(body)
	return c.CompletionsRaw(ctx, b)
}

// CompletionsAs is Completions for tenant (x-kvroute-tenant).
func (c *Client) CompletionsAs(ctx context.Context, tenant string, body map[string]any) Outcome {
	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	b, _ := json.Marshal(body)
	return c.completions(ctx, Outcome{Path: "/v1/completions", Body: b, Tenant: tenant})
}

// CompletionsRaw sends b, an encoded streaming completion request that
// asks for usage, and returns the outcome.
func (c *Client) CompletionsRaw(ctx context.Context, b []byte) Outcome {
	return c.completions(ctx, Outcome{Path: "/v1/completions", Body: b})
}

func (c *Client) completions(ctx context.Context, o Outcome) Outcome {
	if c.done != nil {
		defer c.done()
	}
	c.exchange(ctx, &o)
	return o
}
