package enginesim

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// generateRequest is vLLM's GenerateRequest as the render endpoints return
// it: kv_transfer_params and cache_salt are the request's, as sent.
func (e *Engine) generateRequest(id identity, toks []uint32, salt *string, maxTokens int, kvParams json.RawMessage) map[string]any {
	var s, kv any
	if salt != nil {
		s = *salt
	}
	if t := bytes.TrimSpace(kvParams); len(t) > 0 {
		kv = json.RawMessage(t)
	}
	return map[string]any{
		"request_id":         e.newID("render-"),
		"token_ids":          toks,
		"features":           nil,
		"sampling_params":    map[string]any{"max_tokens": maxTokens},
		"model":              id.model,
		"stream":             false,
		"cache_salt":         s,
		"priority":           0,
		"kv_transfer_params": kv,
	}
}

func (e *Engine) handleChatRender(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	id, toks, budget, err := e.prepareChat(w, r, &req)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, e.generateRequest(id, toks, req.CacheSalt, budget, req.KVTransferParams))
}

func (e *Engine) handleCompletionsRender(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	id, prompts, budgets, err := e.prepareCompletion(w, r, &req)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	out := []any{}
	for i, p := range prompts {
		out = append(out, e.generateRequest(id, p, req.CacheSalt, budgets[i], req.KVTransferParams))
	}
	writeJSON(w, http.StatusOK, out)
}

func (e *Engine) handleResponsesRender(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	id, toks, budget, err := e.prepareResponses(w, r, &req)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, e.generateRequest(id, toks, req.CacheSalt, budget, req.KVTransferParams))
}

type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               *string         `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	Input                json.RawMessage `json:"input"`
	Instructions         *string         `json:"instructions"`
	Tools                json.RawMessage `json:"tools"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
}

func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	err := decodeBody(w, r, &req)
	if err == nil && req.Model != "" {
		_, err = e.resolveModel(req.Model)
	}
	var toks []uint32
	if err == nil {
		switch {
		case len(req.Messages) > 0:
			toks, err = e.renderChat(&chatRequest{Messages: req.Messages, Tools: req.Tools,
				AddGenerationPrompt: req.AddGenerationPrompt, ContinueFinalMessage: req.ContinueFinalMessage})
		case req.Prompt != nil:
			toks = chat.Encode(*req.Prompt)
		case len(req.Input) > 0:
			toks, err = e.renderResponses(&responsesRequest{Input: req.Input, Instructions: req.Instructions, Tools: req.Tools})
		default:
			err = badRequest("tokenize needs prompt, messages or input")
		}
	}
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	var strs any
	if req.ReturnTokenStrs {
		strs, _ = chat.TokenStrs(toks)
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(toks), "max_model_len": e.cfg.MaxModelLen, "tokens": toks, "token_strs": strs})
}

func (e *Engine) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string   `json:"model"`
		Tokens []uint32 `json:"tokens"`
	}
	err := decodeBody(w, r, &req)
	if err == nil && req.Model != "" {
		_, err = e.resolveModel(req.Model)
	}
	var s string
	if err == nil {
		if s, err = chat.Decode(req.Tokens, false); err != nil {
			err = badRequest("%s", err.Error())
		}
	}
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": s})
}
