package enginesim

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// handleModels answers vLLM's ModelList: a card per served name, then per
// LoRA adapter (parent: the first served name, max_model_len null), each
// with one default ModelPermission; created is the time of the call, as
// vLLM's default factories make it.
func (e *Engine) handleModels(w http.ResponseWriter, r *http.Request) {
	created := time.Now().Unix()
	card := func(id, root string, parent, maxLen any) map[string]any {
		perm := map[string]any{"id": e.newID("modelperm-"), "object": "model_permission", "created": created,
			"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
			"allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": nil, "is_blocking": false}
		return map[string]any{"id": id, "object": "model", "created": created, "owned_by": "vllm",
			"root": root, "parent": parent, "max_model_len": maxLen, "permission": []any{perm}}
	}
	var data []any
	for _, n := range e.cfg.servedNames() {
		data = append(data, card(n, e.cfg.Model, nil, e.cfg.MaxModelLen))
	}
	for _, m := range e.cfg.LoRAModules {
		data = append(data, card(m.Name, m.Path, e.cfg.servedNames()[0], nil))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// handleReset answers 200 even when the reset cannot happen, as vLLM does
// (it only logs a warning); reset_running_requests=true preempts running
// requests first so the reset always happens; reset_external=true also
// empties the KV connector's CPU tier.
func (e *Engine) handleReset(w http.ResponseWriter, r *http.Request) {
	truthy := func(v string) bool { return v == "true" || v == "True" || v == "1" }
	q := r.URL.Query()
	err := e.ResetPrefixCache(truthy(q.Get("reset_running_requests")))
	if err == nil && truthy(q.Get("reset_external")) {
		err = e.ResetConnectorCache()
	}
	if errors.Is(err, ErrClosed) {
		e.fail(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	if err != nil {
		e.metrics.resetFailures.Inc()
		e.log.Warn("Failed to reset prefix cache", zap.Error(err))
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) handleRestart(w http.ResponseWriter, r *http.Request) {
	if err := e.Restart(); err != nil {
		e.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"start_time": float64(e.started.Load()) / 1e9})
}

func (e *Engine) handleFaults(w http.ResponseWriter, r *http.Request) {
	var req struct {
		DropEventsPct float64 `json:"drop_events_pct"`
		DelayEventsMS float64 `json:"delay_events_ms"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		e.failErr(w, r, err)
		return
	}
	if req.DelayEventsMS > maxEventDelay.Seconds()*1000 {
		e.fail(w, r, http.StatusBadRequest, fmt.Sprintf("delay_events_ms %v: at most %v", req.DelayEventsMS, maxEventDelay))
		return
	}
	if err := e.SetEventFaults(req.DropEventsPct, time.Duration(req.DelayEventsMS*float64(time.Millisecond))); err != nil {
		e.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, req)
}
