package sidecar

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/sidecar/streamhealth"
)

// Identity is what makes an endpoint's keys comparable with another's.
type Identity struct {
	Endpoint             string `json:"endpoint"` // engine URL of this rank
	Rank                 int    `json:"rank"`
	Model                string `json:"model"`
	BlockSize            int    `json:"block_size"`
	NumGPUBlocks         int    `json:"num_gpu_blocks"`
	HashAlgo             string `json:"prefix_caching_hash_algo"`
	KeyFormat            string `json:"key_format"`
	SummaryParams        string `json:"summary_params"`
	TokenizerFingerprint string `json:"tokenizer_fingerprint"`
}

// Load is the engine's load as last scraped.
type Load struct {
	Waiting   float64   `json:"num_requests_waiting"`
	Running   float64   `json:"num_requests_running"`
	KVUsage   float64   `json:"kv_cache_usage_perc"`
	StartTime float64   `json:"process_start_time_seconds"`
	At        time.Time `json:"scraped_at"`
	Error     string    `json:"error,omitempty"`
	// Engine are the engine's own request figures, cumulative.
	Engine EngineStats `json:"engine"`
}

// EngineStats are the engine's own request figures from its /metrics,
// cumulative since it started, each summed over its family's series: the
// sums (seconds) and counts of vLLM's queue, prefill and TTFT histograms,
// and its prompt and prefix-cache-hit counters. Have: the engine exports
// vllm:time_to_first_token_seconds (an engine exporting none of these
// reports Have false and zeros).
type EngineStats struct {
	Have           bool    `json:"have"`
	QueueSeconds   float64 `json:"queue_seconds"`
	QueueCount     float64 `json:"queue_count"`
	PrefillSeconds float64 `json:"prefill_seconds"`
	PrefillCount   float64 `json:"prefill_count"`
	TTFTSeconds    float64 `json:"ttft_seconds"`
	TTFTCount      float64 `json:"ttft_count"`
	PromptTokens   float64 `json:"prompt_tokens"`
	CachedTokens   float64 `json:"cached_tokens"`
}

// probeConversation is rendered by every replica; equal token ids mean
// equal tokenizer and chat template.
var probeConversation = map[string]any{
	"messages": []map[string]any{
		{"role": "system", "content": "kvroute tokenizer fingerprint probe."},
		{"role": "user", "content": "Hello! Count 1, 2, 3 — ünïcödé, emoji 🙂, code `x := 42`."},
	},
}

// fingerprint hashes the tokens the engine renders for the probe.
func fingerprint(ctx context.Context, hc *http.Client, base, model string) (string, error) {
	body := map[string]any{"model": model}
	for k, v := range probeConversation {
		body[k] = v
	}
	var out struct {
		TokenIDs []uint32 `json:"token_ids"`
		Tokens   []uint32 `json:"tokens"`
	}
	err := postJSON(ctx, hc, base+"/v1/chat/completions/render", body, &out)
	if err != nil { // older engines: /tokenize's chat form
		if err2 := postJSON(ctx, hc, base+"/tokenize", body, &out); err2 != nil {
			return "", fmt.Errorf("render: %v; tokenize: %v", err, err2)
		}
		out.TokenIDs = out.Tokens
	}
	if len(out.TokenIDs) == 0 {
		return "", fmt.Errorf("the engine rendered no tokens for the probe")
	}
	h := sha256.New()
	var b [4]byte
	for _, t := range out.TokenIDs {
		binary.LittleEndian.PutUint32(b[:], t)
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), nil
}

func postJSON(ctx context.Context, hc *http.Client, url string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return do(hc, req, out)
}

func do(hc *http.Client, req *http.Request, out any) error {
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", req.URL.Path, resp.StatusCode)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// firstModel returns the first model /v1/models lists.
func firstModel(ctx context.Context, hc *http.Client, base string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	var out struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := do(hc, req, &out); err != nil {
		return "", err
	}
	for _, m := range out.Data {
		if m.Parent == nil && m.ID != "" {
			return m.ID, nil
		}
	}
	return "", fmt.Errorf("/v1/models lists no base model")
}

// scrapeResult is one parse of the engine's /metrics.
type scrapeResult struct {
	load         Load
	counters     streamhealth.Counters // BlockSize left to the caller
	blockSize    int
	numGPUBlocks int
	hashAlgo     string
}

func scrape(ctx context.Context, hc *http.Client, base string) (scrapeResult, error) {
	var r scrapeResult
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return r, err
	}
	// The engine is in the same pod: compressing its /metrics for us would
	// cost both sides CPU every scrape for nothing.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := hc.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return r, fmt.Errorf("/metrics: status %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return r, fmt.Errorf("/metrics: %w", err)
	}
	sum := func(names ...string) (float64, bool) { return sumFamilies(families, names...) }
	value := func(names ...string) float64 { v, _ := sum(names...); return v }
	r.load = Load{Waiting: value("vllm:num_requests_waiting"), Running: value("vllm:num_requests_running"),
		KVUsage: value("vllm:kv_cache_usage_perc"), StartTime: value("process_start_time_seconds"), At: time.Now()}
	// The stream judge's evidence. vLLM ~0.9–0.10 exported the prefix-cache
	// counters as vllm:gpu_prefix_cache_*.
	c := &r.counters
	var haveHits bool
	c.PrefixQueries, c.HaveQueries = sum("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
	c.PrefixHits, haveHits = sum("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
	c.HaveQueries = c.HaveQueries && haveHits
	c.Requests, c.HaveRequests = sum("vllm:request_success_total")
	c.InFlight = r.load.Waiting + r.load.Running
	c.PromptTokens, c.GenerationTokens = value("vllm:prompt_tokens_total"), value("vllm:generation_tokens_total")
	r.load.Engine = engineStats(families)
	if f := families["vllm:cache_config_info"]; f != nil && len(f.Metric) > 0 {
		for _, l := range f.Metric[0].Label {
			switch l.GetName() {
			case "block_size":
				r.blockSize, _ = strconv.Atoi(l.GetValue())
			case "num_gpu_blocks":
				r.numGPUBlocks, _ = strconv.Atoi(l.GetValue())
			case "prefix_caching_hash_algo":
				r.hashAlgo = l.GetValue()
			}
		}
	}
	return r, nil
}

// sumFamilies adds up every series of the first family of names the
// engine exports, and says whether it exports one.
func sumFamilies(families map[string]*dto.MetricFamily, names ...string) (float64, bool) {
	for _, name := range names {
		f := families[name]
		if f == nil {
			continue
		}
		v := 0.0
		for _, m := range f.Metric {
			if g := m.GetGauge(); g != nil {
				v += g.GetValue()
			} else if c := m.GetCounter(); c != nil {
				v += c.GetValue()
			} else if u := m.GetUntyped(); u != nil {
				v += u.GetValue()
			}
		}
		return v, true
	}
	return 0, false
}

// histogram sums the sum and count of every series of histogram family
// name, and says whether the engine exports it. A family written without
// its TYPE line parses as untyped name_sum and name_count: read as well.
func histogram(families map[string]*dto.MetricFamily, name string) (sum, count float64, ok bool) {
	if f := families[name]; f != nil {
		for _, m := range f.Metric {
			if h := m.GetHistogram(); h != nil {
				sum += h.GetSampleSum()
				count += float64(h.GetSampleCount())
				ok = true
			}
		}
		if ok {
			return sum, count, true
		}
	}
	sum, okSum := sumFamilies(families, name+"_sum")
	count, okCount := sumFamilies(families, name+"_count")
	if !okSum || !okCount {
		return 0, 0, false
	}
	return sum, count, true
}

// engineStats reads the engine's own request figures; Have when it
// exports the TTFT histogram. vLLM ~0.9–0.10 named the prefix-cache hits
// vllm:gpu_prefix_cache_hits_total.
func engineStats(families map[string]*dto.MetricFamily) EngineStats {
	var s EngineStats
	s.TTFTSeconds, s.TTFTCount, s.Have = histogram(families, "vllm:time_to_first_token_seconds")
	s.QueueSeconds, s.QueueCount, _ = histogram(families, "vllm:request_queue_time_seconds")
	s.PrefillSeconds, s.PrefillCount, _ = histogram(families, "vllm:request_prefill_time_seconds")
	s.PromptTokens, _ = sumFamilies(families, "vllm:prompt_tokens_total")
	s.CachedTokens, _ = sumFamilies(families, "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
	if !s.Have {
		return EngineStats{}
	}
	return s
}

// scrapeLoop reads the engine's /metrics every interval: load, cache
// config, the start time that reveals a restart, and the counters the
// stream judge weighs. After every scrape, failed ones included, it judges
// the event stream and sends a load report: a failed scrape reports the
// engine down (with the last good load), the next good one up again.
func (ep *endpoint) scrapeLoop(ctx context.Context, hc *http.Client) {
	t := time.NewTicker(ep.cfg.ScrapeInterval)
	defer t.Stop()
	lastErr := ""
	for {
		sctx, cancel := context.WithTimeout(ctx, ep.cfg.ScrapeTimeout)
		r, err := scrape(sctx, hc, ep.engineURL)
		cancel()
		if ctx.Err() != nil {
			return // shutting down: the failure is ours
		}
		now := time.Now()
		ep.mu.Lock()
		wasDown := ep.load.Error != ""
		if err != nil {
			ep.load.Error = err.Error()
		} else {
			ep.load = r.load
			if r.blockSize > 0 {
				ep.identity.BlockSize = r.blockSize
			}
			if r.numGPUBlocks > 0 {
				ep.identity.NumGPUBlocks = r.numGPUBlocks
			}
			if r.hashAlgo != "" {
				ep.identity.HashAlgo = r.hashAlgo
			}
			r.counters.BlockSize = ep.identity.BlockSize
			if r.counters.BlockSize <= 0 {
				r.counters.BlockSize = ep.idx.BlockSize() // learned from the events
			}
			ep.judge.Scraped(now, r.counters)
		}
		prev, st := ep.stream, ep.judge.Judge(now)
		ep.stream = st
		load, epoch, events := ep.load, ep.epoch, ep.events
		// Sent under ep.mu, so no report taken before a drain was announced
		// reaches a picker after the announcement (Drain).
		ep.hub.load(loadUpdate(ep.identity.Endpoint, epoch, load, st, ep.drainReason()))
		ep.mu.Unlock()
		ep.reportStream(prev, st, events)
		if err != nil {
			ep.metrics.scrapeErrors.WithLabelValues(ep.label()).Inc()
			ep.metrics.engineDown.WithLabelValues(ep.label()).Set(1)
			if msg := err.Error(); msg != lastErr {
				ep.log.Warn("engine metrics scrape failed: reporting the engine down", zap.Error(err))
				lastErr = msg
			}
		} else {
			lastErr = ""
			if wasDown {
				ep.log.Info("engine answers again")
			}
			ep.metrics.engineDown.WithLabelValues(ep.label()).Set(0)
			ep.metrics.requests.WithLabelValues(ep.label(), "waiting").Set(r.load.Waiting)
			ep.metrics.requests.WithLabelValues(ep.label(), "running").Set(r.load.Running)
			ep.metrics.kvUsage.WithLabelValues(ep.label()).Set(r.load.KVUsage)
			if r.load.StartTime > 0 {
				select {
				case ep.restartCh <- r.load.StartTime:
				default:
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reportStream shows a change of the stream's state: the gauge, and one
// log line per transition (warn into a degraded state, info back to live).
func (ep *endpoint) reportStream(prev, st streamhealth.Status, events string) {
	if st.State == prev.State {
		return
	}
	ep.setStreamGauge(st.State)
	fields := []zap.Field{zap.String("from", prev.State.String()), zap.String("state", st.State.String()),
		zap.String("reason", st.Reason), zap.String("events", events), zap.Bool("bind", ep.cfg.Bind)}
	switch st.State {
	case streamhealth.Live, streamhealth.Unknown:
		ep.log.Info("kv event stream state changed", fields...)
	default:
		ep.log.Warn("kv event stream state changed", fields...)
	}
}

// setStreamGauge sets kvroute_sidecar_stream_state: 1 for s, 0 for the
// other states.
func (ep *endpoint) setStreamGauge(s streamhealth.State) {
	for _, x := range streamhealth.States() {
		v := 0.0
		if x == s {
			v = 1
		}
		ep.metrics.streamState.WithLabelValues(ep.label(), x.String()).Set(v)
	}
}

// identify learns the model and the tokenizer fingerprint, retrying until
// the engine answers or the startup timeout passes; each attempt's outcome
// goes to the starting admin surface (the answered and waiting callbacks).
func (ep *endpoint) identify(ctx context.Context, hc *http.Client, override string) (Identity, error) {
	ctx, cancel := context.WithTimeout(ctx, ep.cfg.StartupTimeout)
	defer cancel()
	id := Identity{Endpoint: ep.engineURL, Rank: ep.rank, Model: override}
	var last error
	for {
		var err error
		if id.Model == "" {
			id.Model, err = firstModel(ctx, hc, ep.engineURL)
		}
		if err == nil {
			id.TokenizerFingerprint, err = fingerprint(ctx, hc, ep.engineURL, id.Model)
		}
		if err == nil {
			var r scrapeResult
			if r, err = scrape(ctx, hc, ep.engineURL); err == nil {
				id.BlockSize, id.NumGPUBlocks, id.HashAlgo = r.blockSize, r.numGPUBlocks, r.hashAlgo
				ep.answered(ep.rank)
				return id, nil
			}
		}
		if last == nil || err.Error() != last.Error() {
			ep.log.Info("waiting for the engine", zap.String("url", ep.engineURL), zap.Error(err))
		}
		last = err
		ep.waiting(ep.rank, err) // shown on /readyz while starting
		select {
		case <-ctx.Done():
			return id, fmt.Errorf("engine %s did not answer: %w", ep.engineURL, last)
		case <-time.After(250 * time.Millisecond):
		}
		if strings.TrimSpace(override) == "" {
			id.Model = ""
		}
	}
}
