package fleetview

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/trust"
)

// The trust check's shell: it resolves the names the policy meets (bounded,
// cached), hands both hosts to package picker/trust, and keeps, counts,
// logs and lists what it refuses. The decision is the package's.

// Lookup resolves a host name to its addresses.
type Lookup func(ctx context.Context, host string) ([]netip.Addr, error)

// SystemLookup resolves with the system's resolver (net.DefaultResolver),
// both address families.
func SystemLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// How long a name's answer is kept: an answer, a failure.
const (
	lookupTTL        = 30 * time.Second
	lookupFailureTTL = 5 * time.Second
	lookupCacheMax   = 4096 // names kept at most; past it the cache starts over
)

// errUntrusted ends a stream to a sidecar none of whose endpoints the
// trust check takes, before its summaries are asked for: it is asked
// again, as a sidecar serving no model followed is (notFollowedRecheck).
var errUntrusted = errors.New("fleetview: the sidecar advertises no endpoint on its own host or in an allowed network")

// untrusted is one endpoint the trust check refused, as last offered.
type untrusted struct {
	refused Refused
	detail  string
	since   time.Time // first refused for this reason
}

// trustState is the view's part for the trust check: the name cache and
// the refusals by sidecar address, then endpoint URL. Its own lock guards
// the cache (resolution runs outside the view's); the refusals are under
// the view's lock.
type trustState struct {
	policy  trust.Policy
	lookup  Lookup
	timeout time.Duration

	cacheMu sync.Mutex
	cache   map[string]cachedName

	byAddr  map[string]map[string]untrusted // under View.mu
	refused *prometheus.CounterVec          // refusals (transitions), by reason
}

type cachedName struct {
	host    trust.Host
	expires time.Time
}

// untrustedDesc describes kvroute_picker_endpoints_untrusted.
var untrustedDesc = prometheus.NewDesc("kvroute_picker_endpoints_untrusted",
	"Endpoints refused now because their host is not their sidecar's and no --allow-remote-endpoints network covers it (remote_endpoint), "+
		"their URL names no host (malformed_endpoint) or a name does not resolve (unresolved_endpoint), by reason; listed on /debug/endpoints.",
	[]string{"reason"}, nil)

// trustGauge counts the endpoints refused now, by reason, when scraped.
type trustGauge struct{ v *View }

func (g trustGauge) Describe(ch chan<- *prometheus.Desc) { ch <- untrustedDesc }

func (g trustGauge) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	g.v.mu.RLock()
	for _, eps := range g.v.trust.byAddr {
		for _, u := range eps {
			n[u.refused.Reason]++
		}
	}
	g.v.mu.RUnlock()
	for _, r := range trust.Reasons {
		ch <- prometheus.MustNewConstMetric(untrustedDesc, prometheus.GaugeValue, float64(n[r]), r)
	}
}

// newTrustState prepares the trust check from cfg (valid), saying once
// which networks are allowed.
func newTrustState(cfg *Config, log *zap.Logger) *trustState {
	if len(cfg.AllowRemote) > 0 {
		nets := make([]string, len(cfg.AllowRemote))
		for i, p := range cfg.AllowRemote {
			nets[i] = p.String()
		}
		log.Info("endpoints in these networks are taken from any sidecar (--allow-remote-endpoints)", zap.Strings("networks", nets))
	}
	return &trustState{policy: trust.Policy{Allow: cfg.AllowRemote}, lookup: cfg.Lookup, timeout: cfg.LookupTimeout,
		cache: map[string]cachedName{}, byAddr: map[string]map[string]untrusted{},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_picker_trust_refusals_total",
			Help: "Endpoints refused by the trust check, each time one is (not per stream), by reason (see kvroute_picker_endpoints_untrusted)."}, []string{"reason"})}
}

// validateTrust checks the trust check's part of c.
func (c *Config) validateTrust() error {
	for _, p := range c.AllowRemote {
		if !p.IsValid() {
			return errors.New("fleetview: an invalid network among those allowed remote endpoints")
		}
	}
	if c.Lookup == nil {
		return errors.New("fleetview: no name lookup for the trust check")
	}
	if c.LookupTimeout <= 0 {
		return errors.New("fleetview: the lookup timeout must be positive")
	}
	return nil
}

// host is the trust check's view of a host string: a literal, or the
// name resolved (cached; a lookup bounded by the timeout).
func (t *trustState) host(ctx context.Context, h string) trust.Host {
	if lit, ok := trust.Literal(h); ok {
		return lit
	}
	name := trust.NormName(h)
	now := time.Now()
	t.cacheMu.Lock()
	c, ok := t.cache[name]
	t.cacheMu.Unlock()
	if ok && now.Before(c.expires) {
		return c.host
	}
	lctx, cancel := context.WithTimeout(ctx, t.timeout)
	addrs, err := t.lookup(lctx, name)
	cancel()
	if ctx.Err() != nil {
		return trust.Resolved(name, nil, ctx.Err()) // not cached: the stream is ending
	}
	res := trust.Resolved(name, addrs, err)
	ttl := lookupTTL
	if res.Err != "" {
		ttl = lookupFailureTTL
	}
	t.cacheMu.Lock()
	if len(t.cache) >= lookupCacheMax {
		clear(t.cache)
	}
	t.cache[name] = cachedName{host: res, expires: now.Add(ttl)}
	t.cacheMu.Unlock()
	return res
}

// judge splits a sidecar's endpoints into those the trust check takes and
// those it refuses (with the verdict's detail). It resolves outside the
// view's lock.
func (t *trustState) judge(ctx context.Context, addr string, ids []fleet.Identity) (taken []fleet.Identity, refused []untrusted) {
	if len(ids) == 0 {
		return nil, nil
	}
	var side trust.Host
	sh, serr := trust.SidecarHost(addr)
	if serr == nil {
		side = t.host(ctx, sh)
	}
	for _, id := range ids {
		var v trust.Verdict
		eh, err := trust.EndpointHost(id.Endpoint)
		switch {
		case err != nil:
			v = trust.Malformed(err)
		case serr != nil:
			v = trust.Malformed(serr)
		default:
			v = t.policy.Judge(side, t.host(ctx, eh))
		}
		if v.OK {
			taken = append(taken, id)
			continue
		}
		refused = append(refused, untrusted{refused: Refused{Info: id, Sidecar: addr, Reason: v.Reason}, detail: v.Detail})
	}
	return taken, refused
}

// noteLocked records the trust check's refusals of a sidecar's endpoints
// as it lists them now (taken: the ones it took), logging and counting
// each change once: an endpoint newly refused (or for another reason),
// and one refused before and taken now. Callers hold v.mu.
func (v *View) noteUntrustedLocked(addr string, taken []fleet.Identity, refused []untrusted, now time.Time) {
	t := v.trust
	old := t.byAddr[addr]
	cur := map[string]untrusted{}
	for _, u := range refused {
		url := u.refused.Info.Endpoint
		if prev, ok := old[url]; ok && prev.refused.Reason == u.refused.Reason {
			u.since = prev.since
		} else {
			u.since = now
			t.refused.WithLabelValues(u.refused.Reason).Inc()
			v.refused.Inc()
			v.log.Warn("endpoint refused: not trusted from this sidecar", zap.String("endpoint", url), zap.String("sidecar", addr),
				zap.String("reason", u.refused.Reason), zap.String("detail", u.detail))
		}
		cur[url] = u
	}
	for _, id := range taken {
		if prev, ok := old[id.Endpoint]; ok {
			v.log.Info("endpoint trusted now", zap.String("endpoint", id.Endpoint), zap.String("sidecar", addr),
				zap.String("was", prev.refused.Reason), zap.Duration("refused_for", now.Sub(prev.since)))
		}
	}
	if len(cur) == 0 {
		delete(t.byAddr, addr)
		return
	}
	t.byAddr[addr] = cur
}

// appendUntrustedLocked appends the trust check's refusals to out.
// Callers hold v.mu.
func (v *View) appendUntrustedLocked(out []Refused) []Refused {
	for _, eps := range v.trust.byAddr {
		for _, u := range eps {
			out = append(out, u.refused)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Info.Endpoint < out[j].Info.Endpoint })
	return out
}

// Untrusted says, of an endpoint Refused lists, whether the trust check
// refused it, since when (this process's clock) and why in one sentence.
func (v *View) Untrusted(r Refused) (since time.Time, detail string, ok bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	u, ok := v.trust.byAddr[r.Sidecar][r.Info.Endpoint]
	if !ok || u.refused.Reason != r.Reason {
		return time.Time{}, "", false
	}
	return u.since, u.detail, true
}
