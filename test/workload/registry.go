package workload

import (
	"fmt"
	"strings"
)

// NamedOptions are what a named scenario may need besides its name.
type NamedOptions struct {
	// Trace is the Mooncake JSONL file of the trace scenario.
	Trace string
}

// Names lists the scenarios both clocks run, by name.
func Names() []string {
	return []string{}
}

// Named returns the scenario called name.
func Named(name string, o NamedOptions) (Scenario, error) {
	switch name {
	}
	return nil, fmt.Errorf("scenario %q: want one of %s", name, strings.Join(Names(), ", "))
}
