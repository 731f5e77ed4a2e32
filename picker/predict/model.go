package predict

import (
	"math"
	"slices"

	"github.com/kvroute/kvroute/picker/fleet"
)

// errWindow is how many recent relative errors a Model keeps for its
// median.
const errWindow = 512

// warmup is how many observations are taken whole, none clipped as an
// outlier, while the robust deviation is first measured.
const warmup = 20

// Model is one model group's fit and its endpoints' factors. Not safe for
// concurrent use.
type Model struct {
	cfg Config
	// raw is the least-squares fit, unconstrained (projecting it inside
	// the recursion would leave the covariance inconsistent with it, and
	// the fit drifts); theta, what predictions use, is raw with negative
	// coefficients at 0.
	raw, theta Coefficients
	p          [NumTerms][NumTerms]float64
	dev        float64 // robust deviation of the residuals (seconds)
	n          int     // observations
	// meanTokens is the group's mean uncached prompt per observed request.
	meanTokens float64
	eps        map[string]*endpoint
	errs       []float64 // recent |predicted − observed| ÷ observed, a ring
	errNext    int
}

// endpoint is one endpoint's learned state.
type endpoint struct {
	logSpeed float64
	n        int // observations
	last     fleet.EngineStats
	// meanTokens is the engine's mean uncached prompt per request, from
	// its counters (0: not known yet); queue, prefill and ttft its mean
	// queue, prefill and TTFT seconds per request, from its histograms.
	meanTokens, queue, prefill, ttft float64
	reports                          int // report intervals with requests
}

// New returns a model at cfg's prior.
func New(cfg Config) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Model{cfg: cfg, raw: cfg.Prior, theta: cfg.Prior, dev: cfg.Prior[fOverhead] + 0.01, eps: map[string]*endpoint{}}
	for i := range m.p {
		m.p[i][i] = cfg.PriorSpread[i] * cfg.PriorSpread[i]
	}
	return m, nil
}

func (m *Model) endpoint(url string) *endpoint {
	e := m.eps[url]
	if e == nil {
		e = &endpoint{}
		m.eps[url] = e
	}
	return e
}

// Forget drops what the model learned of an endpoint (it left the fleet).
func (m *Model) Forget(url string) { delete(m.eps, url) }

// Speed is url's speed factor (1: the group's curve).
func (m *Model) Speed(url string) float64 {
	if e := m.eps[url]; e != nil {
		return math.Exp(e.logSpeed)
	}
	return 1
}

// Endpoint is what a decision needs of an endpoint's learned state.
type Endpoint struct {
	// Speed scales the group's curve; MeanTokens is the uncached prompt a
	// request waiting there that this picker did not send is assumed to
	// need.
	Speed, MeanTokens float64
}

// Endpoint returns url's factors for a decision.
func (m *Model) Endpoint(url string) Endpoint {
	out := Endpoint{Speed: 1, MeanTokens: m.meanTokens}
	if e := m.eps[url]; e != nil {
		out.Speed = math.Exp(e.logSpeed)
		if e.meanTokens > 0 {
			out.MeanTokens = e.meanTokens
		}
	}
	return out
}

// MeanTokens is the group's mean uncached prompt per observed request
// (0 before any).
func (m *Model) MeanTokens() float64 { return m.meanTokens }

// Coefficients are the group's current fit.
func (m *Model) Coefficients() Coefficients { return m.theta }

// Predict is f's predicted TTFT on url, by term.
func (m *Model) Predict(url string, f Features) Terms {
	return m.theta.Terms(f, m.Speed(url))
}

// Observe learns from one request: on url, with features f as they were
// at dispatch, its first token came observed seconds after. It returns
// what the model predicted for it before learning. A non-positive or
// non-finite observation is ignored (predicted is still returned).
func (m *Model) Observe(url string, f Features, observed float64) (predicted float64) {
	e := m.endpoint(url)
	predicted = m.theta.Terms(f, math.Exp(e.logSpeed)).Total()
	if !(observed > 0) || math.IsInf(observed, 0) {
		return predicted
	}
	m.recordError(math.Abs(predicted-observed) / observed)
	y := max(observed, 1e-6)
	x := f.Vector()
	// The fleet's curve before learning, without the copies and pulls
	// (which the endpoint's speed does not scale).
	tiers := m.theta.Terms(f, 1).TierLoad
	group := math.Max(m.theta.dot(x)-tiers, 1e-6)
	m.fit(x, y)
	// The endpoint's factor: how it computes against the fleet's curve.
	r := math.Log(math.Max(y-tiers, 1e-6) / group)
	r = math.Max(-math.Ln2, math.Min(math.Ln2, r))
	g := m.cfg.SpeedGain
	e.logSpeed = math.Max(math.Log(m.cfg.MinSpeed), math.Min(math.Log(m.cfg.MaxSpeed), (1-g)*e.logSpeed+g*r))
	e.n++
	m.n++
	if f.Tail >= 0 {
		if m.meanTokens == 0 {
			m.meanTokens = f.Tail
		} else {
			m.meanTokens += m.cfg.TokensGain * (f.Tail - m.meanTokens)
		}
	}
	return predicted
}

// fit is one robust, bounded recursive least-squares step on (x, y).
func (m *Model) fit(x [NumTerms]float64, y float64) {
	lam := m.cfg.Forget
	res := y - m.raw.dot(x)
	c := res
	if m.n < warmup { // the prior may be far off: no residual is an outlier yet
		m.dev += (math.Abs(res) - m.dev) / float64(m.n+1)
	} else {
		clip := math.Max(m.cfg.OutlierSigmas*m.dev, 1e-3)
		c = math.Max(-clip, math.Min(clip, res))
		m.dev += 0.05 * (math.Abs(c) - m.dev)
	}
	var px [NumTerms]float64 // P·x
	for i := range px {
		for j := range x {
			px[i] += m.p[i][j] * x[j]
		}
	}
	den := lam
	for i := range x {
		den += x[i] * px[i]
	}
	for i := range m.raw {
		m.raw[i] += px[i] / den * c
		m.theta[i] = math.Max(0, m.raw[i])
	}
	for i := range m.p {
		for j := range m.p[i] {
			m.p[i][j] = (m.p[i][j] - px[i]*px[j]/den) / lam
		}
	}
	// Bound the covariance by the prior's: forgetting with features that
	// do not vary would otherwise wind it up without limit. Scaling row
	// and column i together keeps it positive semi-definite.
	for i := range m.p {
		cap := m.cfg.PriorSpread[i] * m.cfg.PriorSpread[i]
		if m.p[i][i] > cap {
			s := math.Sqrt(cap / m.p[i][i])
			for j := range m.p {
				m.p[i][j] *= s
				m.p[j][i] *= s
			}
		}
	}
}

func (m *Model) recordError(rel float64) {
	if len(m.errs) < errWindow {
		m.errs = append(m.errs, rel)
		return
	}
	m.errs[m.errNext] = rel
	m.errNext = (m.errNext + 1) % errWindow
}

// MedianError is the median of the recent relative errors, |predicted −
// observed| ÷ observed (NaN before any observation).
func (m *Model) MedianError() float64 {
	if len(m.errs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(m.errs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Observations is how many requests the model learned from.
func (m *Model) Observations() int { return m.n }

// Report takes an engine's cumulative counters from a load report: from
// their growth since its last report, the engine's mean uncached prompt
// per request and its mean queue, prefill and TTFT seconds. A counter that
// went down (the engine restarted) restarts the deltas.
func (m *Model) Report(url string, s fleet.EngineStats) {
	if !s.Have {
		return
	}
	e := m.endpoint(url)
	prev := e.last
	e.last = s
	if !prev.Have || s.TTFTCount < prev.TTFTCount || s.PromptTokens < prev.PromptTokens ||
		s.CachedTokens < prev.CachedTokens || s.QueueCount < prev.QueueCount || s.PrefillCount < prev.PrefillCount {
		return
	}
	n := s.TTFTCount - prev.TTFTCount
	if n < 1 {
		return
	}
	g := m.cfg.TokensGain
	ewma := func(v *float64, x float64) {
		if e.reports == 0 || *v == 0 {
			*v = x
		} else {
			*v += g * (x - *v)
		}
	}
	ewma(&e.meanTokens, max(0, (s.PromptTokens-prev.PromptTokens)-(s.CachedTokens-prev.CachedTokens))/n)
	ewma(&e.ttft, (s.TTFTSeconds-prev.TTFTSeconds)/n)
	if q := s.QueueCount - prev.QueueCount; q >= 1 {
		ewma(&e.queue, (s.QueueSeconds-prev.QueueSeconds)/q)
	}
	if p := s.PrefillCount - prev.PrefillCount; p >= 1 {
		ewma(&e.prefill, (s.PrefillSeconds-prev.PrefillSeconds)/p)
	}
	e.reports++
}

// EndpointState is an endpoint's learned state, for /debug.
type EndpointState struct {
	Speed        float64 `json:"speed_factor"`
	Observations int     `json:"observations"`
	// From the engine's own counters and histograms (0: not reported).
	MeanUncachedTokens float64 `json:"engine_mean_uncached_tokens"`
	MeanQueueSeconds   float64 `json:"engine_mean_queue_s"`
	MeanPrefillSeconds float64 `json:"engine_mean_prefill_s"`
	MeanTTFTSeconds    float64 `json:"engine_mean_ttft_s"`
}

// State is the model as /debug shows it.
type State struct {
	Coefficients map[string]float64 `json:"coefficients"`
	Observations int                `json:"observations"`
	// MedianRelativeError is over the last observations (up to 512); NaN
	// shows as null.
	MedianRelativeError *float64                 `json:"median_relative_error"`
	MeanUncachedTokens  float64                  `json:"mean_uncached_tokens"`
	Endpoints           map[string]EndpointState `json:"endpoints"`
}

// State returns the model's state for /debug.
func (m *Model) State() State {
	st := State{Coefficients: map[string]float64{}, Observations: m.n, MeanUncachedTokens: m.meanTokens, Endpoints: map[string]EndpointState{}}
	for i, v := range m.theta {
		st.Coefficients[termNames[i]] = v
	}
	if me := m.MedianError(); !math.IsNaN(me) {
		st.MedianRelativeError = &me
	}
	for url, e := range m.eps {
		st.Endpoints[url] = EndpointState{Speed: math.Exp(e.logSpeed), Observations: e.n, MeanUncachedTokens: e.meanTokens,
			MeanQueueSeconds: e.queue, MeanPrefillSeconds: e.prefill, MeanTTFTSeconds: e.ttft}
	}
	return st
}
