package enginesim

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// EmbeddingDim is the length of a simulated embedding (the simulated
// model's hidden size).
const EmbeddingDim = 256

// numLabels is the simulated classifier's label count; they are named
// LABEL_0 and LABEL_1, as vLLM names the labels of a Hugging Face config
// without id2label.
const numLabels = 2

// poolingRequest holds the fields of vLLM's pooling bodies (embeddings,
// pooling, classify; score and rerank add their own) that the simulator
// reads; unknown fields are ignored, as vLLM's request models allow them.
type poolingRequest struct {
	Model                string          `json:"model"`
	Input                json.RawMessage `json:"input"`
	Messages             json.RawMessage `json:"messages"`
	AddGenerationPrompt  bool            `json:"add_generation_prompt"` // false for pooling chat bodies
	ContinueFinalMessage bool            `json:"continue_final_message"`
	EncodingFormat       string          `json:"encoding_format"`
	EmbedDType           string          `json:"embed_dtype"`
	Endianness           string          `json:"endianness"`
	Dimensions           *int            `json:"dimensions"`
	Normalize            *bool           `json:"normalize"` // older vLLM's name of use_activation
	UseActivation        *bool           `json:"use_activation"`
	TruncatePromptTokens *int            `json:"truncate_prompt_tokens"`
	CacheSalt            *string         `json:"cache_salt"`
	Task                 *string         `json:"task"`
}

// activation reports use_activation (or normalize), default true.
func (p *poolingRequest) activation() bool {
	switch {
	case p.UseActivation != nil:
		return *p.UseActivation
	case p.Normalize != nil:
		return *p.Normalize
	}
	return true
}

// poolingModel is the name pooling answers report: vLLM's pooling
// servers report the first served name (models.model_name()), adapter or
// not.
func (e *Engine) poolingModel() string { return e.cfg.servedNames()[0] }

// writeList writes vLLM's pooling answer (embeddings, pooling, classify,
// score): an id with the endpoint's prefix, object list, the creation
// time, the model, data, and a UsageInfo of prompt tokens only.
func (e *Engine) writeList(w http.ResponseWriter, idPrefix string, data []any, promptTokens int) {
	writeJSON(w, http.StatusOK, map[string]any{"id": e.newID(idPrefix), "object": "list", "created": time.Now().Unix(),
		"model": e.poolingModel(), "data": data, "usage": map[string]any{"prompt_tokens": promptTokens, "total_tokens": promptTokens,
			"completion_tokens": 0, "prompt_tokens_details": nil}})
}

// checkPoolingLength enforces vLLM's limits on pooling prompts:
// truncate_prompt_tokens (-1: max_model_len; k: keep the last k tokens)
// and the context length. operation words the request as vLLM does in
// the error ("" is the generic wording).
func (e *Engine) checkPoolingLength(prompts [][]uint32, truncate *int, operation string) error {
	limit := e.cfg.MaxModelLen
	if truncate != nil {
		k := *truncate
		switch {
		case k < -1:
			return &apiError{status: http.StatusBadRequest, param: "truncate_prompt_tokens", msg: fmt.Sprintf("truncate_prompt_tokens %d: must be at least -1", k)}
		case k > limit:
			return badRequest("truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size.")
		case k == -1:
			k = limit
		}
		for i, p := range prompts {
			if len(p) > k {
				prompts[i] = p[len(p)-k:]
			}
		}
	}
	for _, p := range prompts {
		if len(p) <= limit {
			continue
		}
		if operation == "" {
			return badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, len(p))
		}
		return badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens in the input for %s. Please reduce the length of the input.", limit, len(p), operation)
	}
	return nil
}

// preparePooling decodes a pooling body and reads its prompts (input, or
// a chat conversation in messages) with vLLM's checks.
func (e *Engine) preparePooling(w http.ResponseWriter, r *http.Request, req *poolingRequest, operation string) (identity, [][]uint32, error) {
	if err := decodeBody(w, r, req); err != nil {
		return identity{}, nil, err
	}
	if err := checkSalt(req.CacheSalt); err != nil {
		return identity{}, nil, err
	}
	id, err := e.resolveModel(req.Model)
	if err != nil {
		return id, nil, err
	}
	var prompts [][]uint32
	if len(req.Messages) > 0 && string(req.Messages) != "null" {
		add := req.AddGenerationPrompt
		toks, err := e.renderChat(&chatRequest{Messages: req.Messages, AddGenerationPrompt: &add, ContinueFinalMessage: req.ContinueFinalMessage})
		if err != nil {
			return id, nil, err
		}
		prompts = [][]uint32{toks}
	} else if prompts, err = parsePrompts("input", req.Input); err != nil {
		return id, nil, err
	}
	return id, prompts, e.checkPoolingLength(prompts, req.TruncatePromptTokens, operation)
}

// pool runs prompts as a pooling model runs them — scheduled and
// prefilled through the paged cache, ending with their prefill (the one
// token sampled after it is dropped) — and returns their pooled hidden
// states.
func (e *Engine) pool(ctx context.Context, id identity, salt string, prompts [][]uint32) ([][]float64, error) {
	steps := make([]int, len(prompts))
	for i := range steps {
		steps[i] = 1
	}
	rn, err := e.start(ctx, generation{id: id, salt: salt, prompts: prompts, budgets: steps, ignoreEOS: true}, kvSource{})
	if err != nil {
		return nil, err
	}
	if _, err := rn.collect(ctx); err != nil {
		return nil, err
	}
	out := make([][]float64, len(prompts))
	for i, p := range prompts {
		out[i] = hidden(p)
	}
	return out, nil
}

func tokenCount(prompts [][]uint32) int {
	n := 0
	for _, p := range prompts {
		n += len(p)
	}
	return n
}

// vectorEncoder checks an embedding body's encoding fields and returns
// how its vectors are written: encoding_format float (a list of numbers)
// or base64 (the raw float32 values, in the endianness asked), as vLLM
// writes them into JSON.
func vectorEncoder(req *poolingRequest) (func([]float32) any, error) {
	format, dtype, end := cmp.Or(req.EncodingFormat, "float"), cmp.Or(req.EmbedDType, "float32"), cmp.Or(req.Endianness, "native")
	switch format {
	case "float", "base64":
	case "bytes", "bytes_only":
		return nil, &apiError{status: http.StatusBadRequest, param: "encoding_format",
			msg: fmt.Sprintf("encoding_format %q is not supported by the simulated engine (float and base64 are)", format)}
	default:
		return nil, &apiError{status: http.StatusBadRequest, param: "encoding_format", msg: fmt.Sprintf("encoding_format %q: want float or base64", format)}
	}
	if dtype != "float32" {
		return nil, &apiError{status: http.StatusBadRequest, param: "embed_dtype", msg: fmt.Sprintf("embed_dtype %q is not supported by the simulated engine (only float32)", dtype)}
	}
	var order binary.ByteOrder
	switch end {
	case "native":
		order = binary.NativeEndian
	case "little":
		order = binary.LittleEndian
	case "big":
		order = binary.BigEndian
	default:
		return nil, &apiError{status: http.StatusBadRequest, param: "endianness", msg: fmt.Sprintf("endianness %q: want native, little or big", end)}
	}
	if format == "float" {
		return func(v []float32) any { return widen(v) }, nil
	}
	return func(v []float32) any {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			order.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return base64.StdEncoding.EncodeToString(b)
	}, nil
}

// checkDimensions refuses dimensions as vLLM does for a model without
// matryoshka representation.
func (e *Engine) checkDimensions(d *int) error {
	if d == nil {
		return nil
	}
	return badRequest("Model %q does not support matryoshka representation, changing output dimensions will lead to poor results.", e.poolingModel())
}

// embedding is a pooled hidden state as an embedding: L2-normalized
// unless use_activation is false, in float32.
func embedding(h []float64, activation bool) []float32 {
	scale := 1.0
	if activation {
		norm := 0.0
		for _, x := range h {
			norm += x * x
		}
		if norm > 0 {
			scale = 1 / math.Sqrt(norm)
		}
	}
	out := make([]float32, len(h))
	for i, x := range h {
		out[i] = float32(x * scale)
	}
	return out
}

// widen is a float32 vector as vLLM's JSON writes it (each value widened
// to a double).
func widen(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// servePooling serves an endpoint taking input (or messages): the body
// prepared with vLLM's checks, then the endpoint's own (check, which
// returns how each prompt's answer is written), the prompts run, the
// answers written as a list.
func (e *Engine) servePooling(w http.ResponseWriter, r *http.Request, operation, idPrefix string,
	check func(*poolingRequest) (func(index int, hidden []float64) any, error)) {
	var req poolingRequest
	id, prompts, err := e.preparePooling(w, r, &req, operation)
	var item func(int, []float64) any
	if err == nil {
		item, err = check(&req)
	}
	var hs [][]float64
	if err == nil {
		hs, err = e.pool(r.Context(), id, saltOf(req.CacheSalt), prompts)
	}
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	data := make([]any, len(hs))
	for i, h := range hs {
		data[i] = item(i, h)
	}
	e.writeList(w, idPrefix, data, tokenCount(prompts))
}

func (e *Engine) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	e.servePooling(w, r, "embedding generation", "embd-", func(req *poolingRequest) (func(int, []float64) any, error) {
		if err := e.checkDimensions(req.Dimensions); err != nil {
			return nil, err
		}
		enc, err := vectorEncoder(req)
		if err != nil {
			return nil, err
		}
		return func(i int, h []float64) any {
			return map[string]any{"index": i, "object": "embedding", "embedding": enc(embedding(h, req.activation()))}
		}, nil
	})
}

// handlePooling serves /pooling: the embedding (task embed, the default)
// or the classifier's probabilities (task classify) as data.
func (e *Engine) handlePooling(w http.ResponseWriter, r *http.Request) {
	e.servePooling(w, r, "", "pool-", func(req *poolingRequest) (func(int, []float64) any, error) {
		task := "embed"
		if req.Task != nil {
			task = *req.Task
		}
		var err error
		switch task {
		case "embed":
			err = e.checkDimensions(req.Dimensions)
		case "classify":
		default:
			err = &apiError{status: http.StatusBadRequest, param: "task",
				msg: fmt.Sprintf("Task %s is not supported by the simulated engine (embed and classify are)", task)}
		}
		if err != nil {
			return nil, err
		}
		enc, err := vectorEncoder(req)
		if err != nil {
			return nil, err
		}
		return func(i int, h []float64) any {
			v := embedding(h, req.activation())
			if task == "classify" {
				v = classify(h, req.activation())
			}
			return map[string]any{"index": i, "object": "pooling", "data": enc(v)}
		}, nil
	})
}

func (e *Engine) handleClassify(w http.ResponseWriter, r *http.Request) {
	e.servePooling(w, r, "classification", "classify-", func(req *poolingRequest) (func(int, []float64) any, error) {
		return func(i int, h []float64) any {
			probs := classify(h, req.activation())
			best := 0
			for k := range probs {
				if probs[k] > probs[best] {
					best = k
				}
			}
			return map[string]any{"index": i, "label": fmt.Sprintf("LABEL_%d", best), "probs": widen(probs), "num_classes": numLabels}
		}, nil
	})
}

// ---- /score and /rerank ----

// scoreRequest is a score or rerank body: a pooling body's common fields
// and the texts to compare, under any of vLLM's names for them.
type scoreRequest struct {
	poolingRequest
	Queries   json.RawMessage `json:"queries"`
	Documents json.RawMessage `json:"documents"`
	Items     json.RawMessage `json:"items"`
	Text1     json.RawMessage `json:"text_1"`
	Text2     json.RawMessage `json:"text_2"`
	Data1     json.RawMessage `json:"data_1"`
	Data2     json.RawMessage `json:"data_2"`
	Query     json.RawMessage `json:"query"`
	TopN      int             `json:"top_n"`
}

func given(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// scoreTexts reads a ScoreInput or a list of them; the simulated engine
// takes text only.
func scoreTexts(field string, raw json.RawMessage) ([]string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []string{s}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, &apiError{status: http.StatusBadRequest, param: field,
			msg: fmt.Sprintf("%s must be a string or a list of strings (multimodal inputs are not supported by the simulated engine)", field)}
	}
	if len(list) > maxPrompts {
		return nil, badRequest("%d %s in one request; at most %d", len(list), field, maxPrompts)
	}
	return list, nil
}

// decodeScore decodes a score or rerank body and checks the model and
// salt; the texts are read by the caller.
func (e *Engine) decodeScore(w http.ResponseWriter, r *http.Request, req *scoreRequest) (identity, error) {
	if err := decodeBody(w, r, req); err != nil {
		return identity{}, err
	}
	if err := checkSalt(req.CacheSalt); err != nil {
		return identity{}, err
	}
	return e.resolveModel(req.Model)
}

// scorePairs embeds the texts of both sides (1:1, 1:N or N:N, as vLLM
// pairs them) and returns each pair's cosine similarity, as vLLM scores
// with an embedding model, and the prompt tokens of all pairs.
func (e *Engine) scorePairs(ctx context.Context, id identity, req *scoreRequest, left, right []string, operation string) ([]float64, int, error) {
	switch {
	case len(left) > 1 && len(left) != len(right):
		return nil, 0, badRequest("Input lengths must be either 1:1, 1:N or N:N")
	case len(left) == 0:
		return nil, 0, badRequest("At least one text element must be given")
	case len(right) == 0:
		return nil, 0, badRequest("At least one text_pair element must be given")
	}
	prompts := make([][]uint32, 0, len(left)+len(right))
	for _, s := range append(append([]string(nil), left...), right...) {
		prompts = append(prompts, chat.Encode(s))
	}
	if err := e.checkPoolingLength(prompts, req.TruncatePromptTokens, operation); err != nil {
		return nil, 0, err
	}
	hs, err := e.pool(ctx, id, saltOf(req.CacheSalt), prompts)
	if err != nil {
		return nil, 0, err
	}
	scores := make([]float64, len(right))
	tokens := 0
	for j := range right {
		i := 0
		if len(left) > 1 {
			i = j
		}
		scores[j] = cosine(hs[i], hs[len(left)+j])
		tokens += len(prompts[i]) + len(prompts[len(left)+j])
	}
	return scores, tokens, nil
}

func (e *Engine) handleScore(w http.ResponseWriter, r *http.Request) {
	var req scoreRequest
	id, err := e.decodeScore(w, r, &req)
	var left, right []string
	if err == nil {
		l, rt, lname, rname := req.Queries, req.Documents, "queries", "documents"
		switch {
		case given(req.Queries) && given(req.Items):
			rt, rname = req.Items, "items"
		case given(req.Data1) || given(req.Data2):
			l, rt, lname, rname = req.Data1, req.Data2, "data_1", "data_2"
		case given(req.Text1) || given(req.Text2):
			l, rt, lname, rname = req.Text1, req.Text2, "text_1", "text_2"
		}
		if !given(l) || !given(rt) {
			err = badRequest("score needs %s and %s (or queries and documents, data_1 and data_2, text_1 and text_2)", lname, rname)
		} else if left, err = scoreTexts(lname, l); err == nil {
			right, err = scoreTexts(rname, rt)
		}
	}
	var scores []float64
	var tokens int
	if err == nil {
		scores, tokens, err = e.scorePairs(r.Context(), id, &req, left, right, "score")
	}
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	data := make([]any, len(scores))
	for i, s := range scores {
		data[i] = map[string]any{"index": i, "object": "score", "score": s}
	}
	e.writeList(w, "score-", data, tokens)
}

func (e *Engine) handleRerank(w http.ResponseWriter, r *http.Request) {
	var req scoreRequest
	id, err := e.decodeScore(w, r, &req)
	var query, docs []string
	switch {
	case err != nil:
	case !given(req.Query) || !given(req.Documents):
		err = badRequest("rerank needs query and documents")
	case req.TopN < 0:
		err = &apiError{status: http.StatusBadRequest, param: "top_n", msg: fmt.Sprintf("top_n %d: must be at least 0", req.TopN)}
	default:
		var q string
		if json.Unmarshal(req.Query, &q) != nil {
			err = &apiError{status: http.StatusBadRequest, param: "query", msg: "query must be a string (multimodal inputs are not supported by the simulated engine)"}
			break
		}
		query = []string{q}
		docs, err = scoreTexts("documents", req.Documents)
	}
	var scores []float64
	var tokens int
	if err == nil {
		scores, tokens, err = e.scorePairs(r.Context(), id, &req, query, docs, "embedding generation")
	}
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	type result struct {
		index int
		score float64
	}
	results := make([]result, len(scores))
	for i, s := range scores {
		results[i] = result{i, s}
	}
	sort.SliceStable(results, func(a, b int) bool { return results[a].score > results[b].score })
	if req.TopN > 0 && req.TopN < len(results) {
		results = results[:req.TopN]
	}
	out := make([]any, len(results))
	for i, x := range results {
		out[i] = map[string]any{"index": x.index, "document": map[string]any{"text": docs[x.index], "multi_modal": nil},
			"relevance_score": x.score}
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": e.newID("score-"), "model": e.poolingModel(),
		"usage": map[string]any{"prompt_tokens": tokens, "total_tokens": tokens}, "results": out})
}

// ---- the simulated model ----

// hidden is the simulated model's pooled hidden state of a prompt: the
// mean over its tokens of a fixed pseudo-random vector per token id, so
// that prompts sharing tokens point alike (a text scores 1 against
// itself, related texts above unrelated ones).
func hidden(toks []uint32) []float64 {
	v := make([]float64, EmbeddingDim)
	for _, t := range toks {
		unitVector(v, uint64(t))
	}
	if len(toks) > 0 {
		for j := range v {
			v[j] /= float64(len(toks))
		}
	}
	return v
}

// unitVector adds to v the fixed pseudo-random vector of seed (components
// uniform in [-1, 1), splitmix64).
func unitVector(v []float64, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 ^ 0x632be59bd9b4e019
	for j := range v {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		v[j] += float64(z>>11)/(1<<53)*2 - 1
	}
}

// classify is the simulated classifier head: a fixed projection of the
// normalized hidden state per label, softmaxed unless activation is off
// (then the logits).
func classify(h []float64, activation bool) []float32 {
	u := embedding(h, true)
	logits := make([]float64, numLabels)
	w := make([]float64, len(h))
	for k := range logits {
		clear(w)
		unitVector(w, 1<<40+uint64(k)) // beyond every token id
		for j := range w {
			logits[k] += float64(u[j]) * w[j]
		}
		logits[k] *= 4
	}
	out := make([]float32, numLabels)
	if !activation {
		for k, l := range logits {
			out[k] = float32(l)
		}
		return out
	}
	top, sum := math.Inf(-1), 0.0
	for _, l := range logits {
		top = max(top, l)
	}
	for _, l := range logits {
		sum += math.Exp(l - top)
	}
	for k, l := range logits {
		out[k] = float32(math.Exp(l-top) / sum)
	}
	return out
}

// cosine is the cosine similarity of two hidden states, in float32 as the
// engine computes it.
func cosine(a, b []float64) float64 {
	var dot, na, nb float64
	for i := range a {
		dot, na, nb = dot+a[i]*b[i], na+a[i]*a[i], nb+b[i]*b[i]
	}
	if na == 0 || nb == 0 {
		return 0
	}
	return float64(float32(dot / math.Sqrt(na*nb)))
}
