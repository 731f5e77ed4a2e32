package workload

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"
)

// Phase is one period of a phased scenario (Phased): its name and its
// length in simulated time.
type Phase struct {
	Name string
	For  time.Duration
}

// Phased is a scenario whose load steps are phases of set lengths: the
// requests of step k (1, 2, …) are sent within the k-th phase, which
// starts when the one before ends (the first at the run's start). The
// lab measures a phase's throughput over its window.
type Phased interface {
	Scenario
	Phases() []Phase
}

// simDefaultPrefill is the sim-default profile's prefill rate, tokens a
// second per engine (test/enginesim/profile): the capacity Tenants'
// loads are multiples of.
const simDefaultPrefill = 10000

// Tenants is two tenants sharing a fleet, one sending ten times the
// other's load: a light tenant alone, then beside a heavy one — the
// fairness target of --engine-priority (the light tenant's p99 TTFT
// beside the heavy one within 1.5× its p99 alone; the heavy tenant's
// throughput at least 0.9× what it gets without priorities). Each
// request is a streaming text /v1/completions with ignore_eos of its
// tenant's shared prefix and a prompt of its own, salted per tenant
// (cache_salt "salt-light", "salt-heavy"), sent with its tenant
// (Request.Tenant "light" or "heavy", the x-kvroute-tenant header: the
// picker's fairness key). Open loop: Poisson arrivals, one merged stream
// per phase, each arrival's tenant drawn by its rate. Step is the phase
// (1 alone, 2 contended); every request is its own conversation (turn
// 1). Deterministic from the seed.
//
// Source and scaling (source | here): the bench's tenants scenario
// (test/bench admission.go, Tenants) | the same shape in virtual time:
//   - 2 engines × 2,048 blocks of 16, sim-default | the same, no CPU
//     tier.
//   - a 256-token shared prefix per tenant, 2,000 unique tokens, 8
//     output tokens | the same.
//   - capacity prefill-bound: engines × 10,000 tokens a second ÷ 2,000
//     unique tokens = 10 requests a second | the same.
//   - alone 30 s: light at 0.25× capacity (2.5 requests a second);
//     contended 60 s: light 0.25× and heavy 2.5× (25 a second) | the
//     same: ≈ 75 + 1,650 requests. Rate multiplies both tenants' rates;
//     the phases keep their lengths.
//
// The bench runs the picker's admission control, which sheds what the
// fleet cannot take; the lab runs none, so the contended phase offers
// 2.75× the fleet's capacity and the engines' waiting queues grow
// through it (by ≈ 17 requests a second), draining after the last
// arrival. That is expected: under first come, first served the light
// tenant's requests wait behind the heavy tenant's backlog; under the
// engines' priority policy they may pass it.
//
// Zero fields take the defaults in brackets.
type Tenants struct {
	Engines   int // [2]
	GPUBlocks int // KV blocks of 16 tokens per engine [2048]
	// SharedTokens, UniqueTokens and OutputTokens size a request [256,
	// 2000, 8].
	SharedTokens, UniqueTokens, OutputTokens int
	// Alone and Contended are the phases' lengths [30 s, 60 s].
	Alone, Contended time.Duration
	// Light and Heavy are the tenants' loads, multiples of the fleet's
	// capacity [0.25, 2.5]; the heavy tenant sends in the contended
	// phase only.
	Light, Heavy float64
}

func (t Tenants) withDefaults() Tenants {
	t.Engines, t.GPUBlocks = cmp.Or(t.Engines, 2), cmp.Or(t.GPUBlocks, 2048)
	t.SharedTokens, t.UniqueTokens, t.OutputTokens = cmp.Or(t.SharedTokens, 256), cmp.Or(t.UniqueTokens, 2000), cmp.Or(t.OutputTokens, 8)
	t.Alone, t.Contended = cmp.Or(t.Alone, 30*time.Second), cmp.Or(t.Contended, 60*time.Second)
	t.Light, t.Heavy = cmp.Or(t.Light, 0.25), cmp.Or(t.Heavy, 2.5)
	return t
}

// Name is the scenario's name.
func (Tenants) Name() string { return "tenants" }

// Fleet is the fleet the scenario is defined for: sim-default engines
// without a CPU tier (the driver's default context).
func (t Tenants) Fleet() Fleet {
	t = t.withDefaults()
	return Fleet{Engines: t.Engines, GPUBlocks: t.GPUBlocks}
}

// SLO is 1 s: about four times a request's cold prefill (≈ 2,280
// tokens ≈ 0.23 s at 10,000 tokens a second, plus a step), which the
// light tenant alone meets with room; a request queued behind the
// contended phase's backlog does not.
func (Tenants) SLO() time.Duration { return time.Second }

// Phases are the two phases: alone, then contended.
func (t Tenants) Phases() []Phase {
	t = t.withDefaults()
	return []Phase{{Name: "alone", For: t.Alone}, {Name: "contended", For: t.Contended}}
}

// Capacity is the fleet's prefill-bound request rate (type doc).
func (t Tenants) Capacity() float64 {
	t = t.withDefaults()
	return float64(t.Engines) * simDefaultPrefill / float64(t.UniqueTokens)
}

// Plan draws the prefixes and the arrivals for o.
func (t Tenants) Plan(o Options) (Plan, error) {
	t = t.withDefaults()
	if err := checkOptions("tenants", o); err != nil {
		return Plan{}, err
	}
	if t.Engines < 1 || t.GPUBlocks < 2 || t.SharedTokens < 1 || t.UniqueTokens < 1 || t.OutputTokens < 1 || t.Alone <= 0 || t.Contended <= 0 ||
		!(t.Light > 0) || !(t.Heavy > 0) {
		return Plan{}, fmt.Errorf("tenants: bad shape %+v", t)
	}
	// The prefix's and the request's headers add a few tokens each.
	if err := checkFits("tenants", o.MaxModelLen, t.SharedTokens+t.UniqueTokens+32, t.OutputTokens); err != nil {
		return Plan{}, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x74656e61)) // "tena"
	names := []string{"light", "heavy"}
	prefixes := map[string]string{}
	for _, name := range names {
		prefixes[name] = fmt.Sprintf("Tenant %s shared instructions. ", name) + Text(rng, t.SharedTokens)
	}
	capacity := t.Capacity()
	loads := []map[string]float64{{"light": t.Light}, {"light": t.Light, "heavy": t.Heavy}}
	var p Plan
	var from time.Duration
	n := 0
	for i, ph := range t.Phases() {
		total := 0.0
		for _, name := range names {
			total += loads[i][name] * capacity * o.Rate
		}
		for at := from; ; {
			at += poissonGap(rng, total)
			if at >= from+ph.For {
				break
			}
			x, tenant := rng.Float64()*total, names[len(names)-1]
			for _, name := range names {
				if x -= loads[i][name] * capacity * o.Rate; x < 0 && loads[i][name] > 0 {
					tenant = name
					break
				}
			}
			n++
			id, seed, step := n, rng.Uint64(), i+1
			p.Sessions = append(p.Sessions, Planned{Start: at, Session: &single{build: func() Request {
				own := rand.New(rand.NewPCG(seed, uint64(id)))
				b, err := json.Marshal(textCompletionBody{Model: servedModel,
					Prompt:    prefixes[tenant] + fmt.Sprintf("Request %d. ", id) + Text(own, t.UniqueTokens),
					MaxTokens: t.OutputTokens, IgnoreEOS: true, CacheSalt: "salt-" + tenant, Stream: true,
					StreamOptions: includeUsageOption{IncludeUsage: true}})
				if err != nil {
					panic(err) // strings, ints and bools always encode
				}
				return Request{Path: "/v1/completions", Body: b, Tenant: tenant, Conversation: id, Turn: 1, Step: step}
			}}})
		}
		from += ph.For
	}
	return p, nil
}
