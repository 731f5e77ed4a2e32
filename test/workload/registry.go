package workload

import (
	"fmt"
	"strings"
)

// NamedOptions are what a named scenario may need besides its name.
type NamedOptions struct {
	// Trace is the Mooncake JSONL file of the trace scenario; TraceLimit,
	// when positive, replays only its first TraceLimit records.
	Trace      string
	TraceLimit int
}

// Names lists the scenarios both clocks run, by name.
func Names() []string {
	return []string{"agentic-pressure", "agentic-chat", "b2b-saas", "hot-prefix", "coding-agent", "trace", "uniform-pool", "doc-qa", "hot-set", "tiered-eviction", "tenants", "demo"}
}

// Named returns the scenario called name.
func Named(name string, o NamedOptions) (Scenario, error) {
	switch name {
	case "agentic-pressure":
		return AgenticPressure{}, nil
	case "agentic-chat":
		return AgenticChat(), nil
	case "demo":
		return Demo(), nil
	case "b2b-saas":
		return B2BSaaS{}, nil
	case "hot-prefix":
		return HotPrefix{}, nil
	case "coding-agent":
		return CodingAgent{}, nil
	case "uniform-pool":
		return UniformPool{}, nil
	case "doc-qa":
		return DocQA{}, nil
	case "hot-set":
		return HotSet{}, nil
	case "tiered-eviction":
		return TieredEviction{}, nil
	case "tenants":
		return Tenants{}, nil
	case "trace":
		if o.Trace == "" {
			return nil, fmt.Errorf("scenario trace needs a Mooncake JSONL file (--trace FILE)")
		}
		return Trace{Path: o.Trace, Limit: o.TraceLimit}, nil
	}
	return nil, fmt.Errorf("scenario %q: want one of %s", name, strings.Join(Names(), ", "))
}
