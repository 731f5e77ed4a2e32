package verify

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/internal/debugapi"
)

// Check is one verdict.
type Check struct {
	Name     string `json:"name"`               // e.g. "identity block_size"
	Endpoint string `json:"endpoint,omitempty"` // the endpoint judged ("" for fleet-wide checks)
	OK       bool   `json:"ok"`
	Detail   string `json:"detail"`           // the numbers behind the verdict
	Cause    string `json:"cause,omitempty"`  // the likely cause, on failure
	Figure   string `json:"figure,omitempty"` // a measured figure worth a look even on a pass, e.g. "23 ms"
}

// Group is the endpoints serving one model and the values they agree on
// (the majority's, field by field).
type Group struct {
	Model     string            `json:"model"`
	Endpoints []string          `json:"endpoints"`
	Values    map[string]string `json:"values"` // field → majority value ("" when tied)
}

// field is a compared identity field, with the cause of a mismatch.
type field struct {
	name  string
	get   func(debugapi.Endpoint) string
	cause string
}

var fields = []field{
	{"block_size", func(e debugapi.Endpoint) string { return fmt.Sprint(e.BlockSize) },
		"the engine runs another --block-size: its block hashes cover other token spans, so no key can match"},
	{"hash_algo", func(e debugapi.Endpoint) string { return e.HashAlgo },
		"the engine runs another --prefix-caching-hash-algo: its hashes differ for the same tokens"},
	{"key_format", func(e debugapi.Endpoint) string { return e.KeyFormat },
		"the sidecar is another kvroute version with another key format: upgrade the fleet to one version"},
	{"summary_params", func(e debugapi.Endpoint) string { return e.SummaryParams },
		"the sidecar's summaries are sized otherwise (--capacity): set the same value on every sidecar and picker"},
	{"tokenizer_fingerprint", func(e debugapi.Endpoint) string { return e.TokenizerFingerprint },
		"the engine tokenizes or templates differently (another tokenizer, revision or chat template): the picker's tokens will not be the engine's"},
}

// Thresholds for freshness.
const DefaultMaxStale = 5.0 // seconds without an update from the sidecar

// Consistency groups eps by model and checks every endpoint's identity
// against its model's majority, its sidecar's freshness (stale beyond
// maxStale seconds, or partial), and its state on the picker
// (JudgePickerState).
func Consistency(eps []debugapi.Endpoint, maxStale float64) ([]Group, []Check) {
	byModel := map[string][]debugapi.Endpoint{}
	for _, e := range eps {
		byModel[e.Model] = append(byModel[e.Model], e)
	}
	var groups []Group
	var checks []Check
	for _, model := range slices.Sorted(maps.Keys(byModel)) {
		members := byModel[model]
		slices.SortFunc(members, func(a, b debugapi.Endpoint) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
		g := Group{Model: model, Values: map[string]string{}}
		for _, e := range members {
			g.Endpoints = append(g.Endpoints, e.Endpoint)
		}
		for _, f := range fields {
			majority, tied := mostCommon(members, f.get)
			if !tied {
				g.Values[f.name] = majority
			}
			for _, e := range members {
				v := f.get(e)
				c := Check{Name: "identity " + f.name, Endpoint: e.Endpoint, OK: !tied && v == majority}
				switch {
				case c.OK:
					c.Detail = fmt.Sprintf("%s %q, as the other %s endpoints", f.name, v, model)
				case tied:
					c.Detail = fmt.Sprintf("%s %q; %s's endpoints are split with no majority", f.name, v, model)
					c.Cause = f.cause
				default:
					c.Detail = fmt.Sprintf("%s %q, %s's majority has %q", f.name, v, model, majority)
					c.Cause = f.cause
				}
				checks = append(checks, c)
			}
		}
		groups = append(groups, g)
	}
	for _, e := range eps {
		c := Check{Name: "sidecar fresh", Endpoint: e.Endpoint, OK: true, Detail: fmt.Sprintf("updated %.1f s ago", e.StaleSecs)}
		switch {
		case e.Partial:
			c.OK, c.Detail = false, "the sidecar's state is partial"
			c.Cause = "KV events were lost and could not be replayed (is the engine's replay endpoint set and reachable?): matches may be missing until the engine's cache turns over"
		case e.NeverUpdated:
			c.OK, c.Detail = false, "the sidecar has sent nothing for this endpoint yet"
			c.Cause = "the sidecar's summary stream to the picker has not started or delivered (sidecar starting, or the stream failing): check the picker's logs"
		case e.StaleSecs > maxStale:
			c.OK, c.Detail = false, fmt.Sprintf("no update for %.1f s (more than %.0f s)", e.StaleSecs, maxStale)
			c.Cause = "the sidecar stopped streaming or cannot scrape its engine: check its /readyz and logs"
		}
		checks = append(checks, c, JudgePickerState(e))
	}
	slices.SortStableFunc(checks, func(a, b Check) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
	return groups, checks
}

// JudgePickerState checks the picker's health state of e: only an
// endpoint routed with cache knowledge passes. A picker that reports no
// state (an older one) is not judged.
func JudgePickerState(e debugapi.Endpoint) Check {
	c := Check{Name: "picker state", Endpoint: e.Endpoint}
	why := ""
	if e.StateReason != "" {
		why = ": " + e.StateReason
	}
	switch e.State {
	case "":
		c.OK, c.Detail = true, "the picker reports no health state (an older picker): not judged"
	case "cached":
		c.OK, c.Detail = true, "routed with cache knowledge"
	case "load_only":
		c.Detail = "routed by load only, with no cache credit" + why
		c.Cause = "the picker does not know what the engine caches: see this endpoint's sidecar stream and freshness checks"
	case "draining":
		c.Detail = "draining" + why
		c.Cause = "its sidecar announced that the engine is going away (SIGTERM, as when its pod is deleted): it gets no new request; verify again once it is gone or replaced"
	case "down":
		c.Detail = "down, sent nothing" + why
		c.Cause = "the engine cannot be reached or its sidecar is silent: an ejected engine comes back once the picker's health probe succeeds"
	default:
		c.Detail = fmt.Sprintf("state %q%s", e.State, why)
		c.Cause = "the picker reports a state this verify does not know: use the same kvroute version for both"
	}
	return c
}

// Groups is Consistency's groups alone: the models of eps, sorted, each
// with its endpoints and majority values.
func Groups(eps []debugapi.Endpoint) []Group {
	groups, _ := Consistency(eps, DefaultMaxStale)
	return groups
}

// mostCommon returns the most common value of get over eps, and whether
// the top count is shared by several values.
func mostCommon(eps []debugapi.Endpoint, get func(debugapi.Endpoint) string) (string, bool) {
	n := map[string]int{}
	for _, e := range eps {
		n[get(e)]++
	}
	best, top, tied := "", 0, false
	for _, v := range slices.Sorted(maps.Keys(n)) {
		switch {
		case n[v] > top:
			best, top, tied = v, n[v], false
		case n[v] == top:
			tied = true
		}
	}
	return best, tied && len(eps) > 1
}

// Failed returns the checks that failed.
func Failed(checks []Check) []Check {
	return slices.DeleteFunc(slices.Clone(checks), func(c Check) bool { return c.OK })
}

// Summary is a one-line count of checks.
func Summary(checks []Check) string {
	failed := len(Failed(checks))
	return strings.TrimSpace(fmt.Sprintf("%d checks, %d passed, %d failed", len(checks), len(checks)-failed, failed))
}

// Refused is the check of an endpoint the picker did not take (never
// routed to): reason is the picker's (summary_params, group_full,
// other_owner, or the trust check's remote_endpoint, malformed_endpoint,
// unresolved_endpoint).
func Refused(endpoint, reason, summaryParams string) Check {
	c := Check{Name: "routable", Endpoint: endpoint, Detail: "the picker refused the endpoint: " + reason}
	switch reason {
	case "summary_params":
		c.Detail += " (its sidecar's summaries are " + summaryParams + ")"
		c.Cause = "the sidecar's --capacity differs from the pickers': set the same value everywhere"
	case "group_full":
		c.Cause = "the identity group has no free slot in the picker: raise the picker's slots or split the fleet"
	case "other_owner":
		c.Cause = "two sidecars claim the same engine URL (a loopback --engine-url?): each sidecar must advertise its engine's own address"
	case "remote_endpoint":
		c.Cause = "the sidecar advertises an engine on another host than its own (the address the picker dials it at): run the sidecar beside its engine with --engine-url " +
			"at that host's address (in Kubernetes the pod IP, as the sidecar component sets it); if engines elsewhere are meant, allow their network with the picker's --allow-remote-endpoints CIDR"
	case "malformed_endpoint":
		c.Cause = "the sidecar's --engine-url names no host the picker can check: give http://host:port with the engine's own address"
	case "unresolved_endpoint":
		c.Cause = "the picker cannot resolve the endpoint's (or its sidecar's) host name: fix the name or its DNS, or advertise IP addresses"
	default:
		c.Cause = "see the picker's logs"
	}
	return c
}
