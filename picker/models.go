package picker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
)

// modelRef is a model name as one identity group serves it.
type modelRef struct {
	group string
	lora  string // the adapter, when the name is one
}

// modelEntry is one entry of an engine's /v1/models.
type modelEntry struct {
	ID     string  `json:"id"`
	Parent *string `json:"parent"`
}

// modelDirectory maps request model names (base models and LoRA adapters)
// to the identity group serving them. It learns the names from one engine
// of every group, refreshing at most once a second when a name is
// unknown; the rule that builds the map is buildModels, pure.
type modelDirectory struct {
	endpoints func() []fleet.Endpoint
	list      func(ctx context.Context, base string) ([]modelEntry, error)
	log       *zap.Logger
	// shard are the models this picker follows (fleetview.Config.Models);
	// none: every model. A name unknown here is then another shard's.
	shard []string

	refreshMu sync.Mutex // one refresh at a time

	mu          sync.Mutex
	models      map[string]modelRef
	lastRefresh time.Time
}

// resolve finds the group serving a model name.
func (d *modelDirectory) resolve(name string) (modelRef, error) {
	lookup := func() (modelRef, bool, bool) {
		d.mu.Lock()
		defer d.mu.Unlock()
		ref, ok := d.models[name]
		return ref, ok, time.Since(d.lastRefresh) > time.Second
	}
	if ref, ok, _ := lookup(); ok {
		return ref, nil // a group gone empty answers 503, and the next unknown name refreshes
	}
	// One refresh at a time, at most one a second, whatever its outcome;
	// requests arriving meanwhile wait for it rather than miss.
	d.refreshMu.Lock()
	ref, ok, stale := lookup()
	if !ok && stale {
		d.mu.Lock()
		d.lastRefresh = time.Now()
		d.mu.Unlock()
		d.refresh(context.Background())
		ref, ok, _ = lookup()
	}
	d.refreshMu.Unlock()
	if ok {
		return ref, nil
	}
	if len(d.shard) > 0 {
		return modelRef{}, notThisShard(name, d.shard)
	}
	return modelRef{}, modelNotFound(name)
}

// notThisShard is the refusal of a model name by a picker that follows
// only some models (--models): 404 model_not_found as vLLM answers an
// unknown model, saying the name may be another picker shard's.
func notThisShard(name string, shard []string) *intake.Error {
	return &intake.Error{Status: http.StatusNotFound, Type: "NotFoundError", Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("The model `%s` is not served by this picker shard, which follows only %s: send it to the shard that serves it.",
			name, strings.Join(shard, ", "))}
}

// modelNotFound is the refusal of a model name no engine serves, worded
// as vLLM words it.
func modelNotFound(name string) *intake.Error {
	return &intake.Error{Status: http.StatusNotFound, Type: "NotFoundError", Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("The model `%s` does not exist.", name)}
}

// refresh asks up to three engines of every group for its model list.
func (d *modelDirectory) refresh(ctx context.Context) {
	groups := groupsOf(d.endpoints())
	lists := map[string][]modelEntry{}
	for _, g := range groups {
		var list []modelEntry
		var err error
		for _, e := range g.endpoints[:min(len(g.endpoints), 3)] { // an engine that does not answer is not the group
			if list, err = d.list(ctx, e.URL); err == nil {
				break
			}
			d.log.Debug("model list", zap.String("engine", e.URL), zap.Error(err))
		}
		if err == nil {
			lists[g.id] = list
		}
	}
	d.mu.Lock()
	old := d.models
	d.mu.Unlock()
	models := buildModels(groups, lists, old)
	d.mu.Lock()
	d.models = models
	d.mu.Unlock()
}

// modelGroup is one identity group's endpoints, sorted by URL.
type modelGroup struct {
	id        string
	endpoints []fleet.Endpoint
}

// groupsOf groups endpoints by identity group, larger groups first (ties
// by id), each group's endpoints sorted by URL.
func groupsOf(eps []fleet.Endpoint) []modelGroup {
	by := map[string][]fleet.Endpoint{}
	for _, e := range eps {
		by[e.Group] = append(by[e.Group], e)
	}
	out := make([]modelGroup, 0, len(by))
	for id, g := range by {
		sort.Slice(g, func(i, j int) bool { return g[i].URL < g[j].URL })
		out = append(out, modelGroup{id: id, endpoints: g})
	}
	sort.Slice(out, func(i, j int) bool {
		if len(out[i].endpoints) != len(out[j].endpoints) {
			return len(out[i].endpoints) > len(out[j].endpoints)
		}
		return out[i].id < out[j].id
	})
	return out
}

// buildModels is the directory for groups (largest first) given the model
// lists that could be had (by group id): a name served by several groups
// goes to the largest; every group serves its base model; an entry with
// a parent is a LoRA adapter; a group whose list could not be had keeps
// the names old gave it.
func buildModels(groups []modelGroup, lists map[string][]modelEntry, old map[string]modelRef) map[string]modelRef {
	models := map[string]modelRef{}
	for _, g := range groups {
		list, ok := lists[g.id]
		if !ok {
			for name, ref := range old { // keep what the group was known to serve
				if ref.group == g.id {
					models[name] = ref
				}
			}
		}
		base := g.endpoints[0].Info.Model
		if _, ok := models[base]; !ok {
			models[base] = modelRef{group: g.id}
		}
		for _, m := range list {
			if _, ok := models[m.ID]; ok {
				continue
			}
			if m.Parent != nil && *m.Parent != "" {
				models[m.ID] = modelRef{group: g.id, lora: m.ID}
			} else {
				models[m.ID] = modelRef{group: g.id}
			}
		}
	}
	return models
}

// listModels asks one engine for its model list.
func listModels(ctx context.Context, hc *http.Client, base, apiKey string) ([]modelEntry, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/v1/models: status %d", resp.StatusCode)
	}
	var list struct {
		Data []modelEntry `json:"data"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 4<<20)).Decode(&list); err != nil {
		return nil, err
	}
	return list.Data, nil
}
