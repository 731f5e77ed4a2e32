package fleetview

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip"
)

// followsMeta reports whether the view dials a sidecar that gossip
// describes with meta: always without Config.Models, and always when the
// sidecar advertises no models (an older sidecar, or names that did not
// fit in its metadata: unknown, so it is dialled and asked what it
// serves, as before models were advertised); else only when one of the
// models it advertises is followed.
func (v *View) followsMeta(meta gossip.Meta) bool {
	if v.models == nil || len(meta.Models) == 0 {
		return true
	}
	for _, m := range meta.Models {
		if v.models[m] {
			return true
		}
	}
	return false
}

// streamingGossiped reports whether a stream follows addr because gossip
// advertised it (not WatchStatic).
func (v *View) streamingGossiped(addr string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	ref, ok := v.streams[addr]
	return ok && !ref.static
}

// unfollowModels stops following a sidecar whose metadata now advertises
// only models the view does not follow (its engine redeployed with
// another model): its stream ends, and its endpoints go at once rather
// than by load only for the grace period of a lost sidecar's, their
// engines serving another model now. Like Forget, it is exact: the stream
// checks its context under the same lock before touching the state.
func (v *View) unfollowModels(addr string, models []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dropStream(addr) {
		v.log.Info("sidecar no longer followed: it advertises no model among --models",
			zap.String("sidecar", addr), zap.Strings("models", models))
	}
	v.state.Forget(addr)
}

// skippedMember is a gossip member not dialled for its models.
type skippedMember struct {
	addr   string   // the gRPC address it advertises
	models []string // the models it advertises, none followed
}

// modelSkips are the sidecars gossip lists that the view does not dial
// because none of the models they advertise is followed, by member name
// (kvroute_picker_sidecars_skipped_for_model). It has a lock of its own.
type modelSkips struct {
	log     *zap.Logger
	mu      sync.Mutex
	members map[string]skippedMember
}

func newModelSkips(log *zap.Logger) *modelSkips {
	return &modelSkips{log: log, members: map[string]skippedMember{}}
}

// note records whether the member name (advertising addr and models) is
// skipped, logging at debug when it starts to be, its models change, or
// it stops being skipped.
func (s *modelSkips) note(name string, sk skippedMember, skipped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, was := s.members[name]
	switch {
	case skipped && (!was || old.addr != sk.addr || !slices.Equal(old.models, sk.models)):
		s.members[name] = sk
		s.log.Debug("sidecar not dialled: it advertises no model among --models",
			zap.String("member", name), zap.String("sidecar", sk.addr), zap.Strings("models", sk.models))
	case !skipped && was:
		delete(s.members, name)
		s.log.Debug("sidecar advertises a model among --models now: following it",
			zap.String("member", name), zap.String("sidecar", sk.addr), zap.Strings("models", sk.models))
	}
}

// reset makes the skipped members exactly those of a full listing,
// logging those newly skipped as note does.
func (s *modelSkips) reset(skipped map[string]skippedMember) {
	s.mu.Lock()
	for name := range s.members {
		if _, ok := skipped[name]; !ok {
			delete(s.members, name) // gone, or followed now (Watch logs that)
		}
	}
	s.mu.Unlock()
	for name, sk := range skipped {
		s.note(name, sk, true)
	}
}

// skippedAddr reports whether a skipped member advertises addr.
func (s *modelSkips) skippedAddr(addr string) ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sk := range s.members {
		if sk.addr == addr {
			return sk.models, true
		}
	}
	return nil, false
}

// skippedDesc describes kvroute_picker_sidecars_skipped_for_model.
var skippedDesc = prometheus.NewDesc("kvroute_picker_sidecars_skipped_for_model",
	"Sidecars gossip lists that this picker does not dial: the models they advertise are not among its --models (another picker shard serves them).", nil, nil)

func (s *modelSkips) Describe(ch chan<- *prometheus.Desc) { ch <- skippedDesc }

func (s *modelSkips) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	n := len(s.members)
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(skippedDesc, prometheus.GaugeValue, float64(n))
}
