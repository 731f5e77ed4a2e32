package localfleet

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleet"
)

// Config configures a Fleet.
//
// One rule for defaults: DefaultConfig returns every documented default,
// and a zero value is never a default but invalid — Validate rejects it
// and New does not fill it in. Start from DefaultConfig and set Params,
// which has no default.
type Config struct {
	// Params are the fleet-wide summary parameters (the picker's and the
	// sidecars' --capacity, through summary.ForCapacity): the sidecars
	// this fleet makes (Add) use them, and endpoints advertising others
	// are refused. No default.
	Params summary.Params
	// Slots bounds the endpoints of one identity group, 1..fleet.MaxSlots.
	// Default fleet.DefaultSlots.
	Slots int
	// Health holds the limits endpoint health is judged by; the fleet
	// uses them for ReportFailure and Probe (the ejection backoff). The
	// router judges health with its own, the same one. Default
	// fleet.DefaultHealthConfig().
	Health fleet.HealthConfig
	// Models, when set, are the only models the fleet follows: Register
	// refuses an endpoint of another (ErrNotFollowed). Default none:
	// every model.
	Models []string
	// Clock is the time where a call carries none: ReportFailure's, and
	// the reads' when InSync. Default time.Now; the lab passes its virtual
	// clock.
	Clock func() time.Time
	// InSync makes every read see each endpoint as heard from at Clock():
	// nothing stands between an in-process sidecar and the fleet state
	// that could go silent, so an endpoint never turns stale or down for
	// want of updates, whether the caller sends load reports or not.
	// False: an endpoint is as fresh as the last update the caller gave
	// it (Receive, Publish, SetLoad), as over a real stream, for a caller
	// that models a sidecar going silent and drives the clock itself.
	// Default true.
	InSync bool
}

// DefaultConfig returns the defaults: Slots fleet.DefaultSlots, the
// default health limits, every model, the wall clock, in sync; Params
// unset.
func DefaultConfig() Config {
	return Config{Slots: fleet.DefaultSlots, Health: fleet.DefaultHealthConfig(), Clock: time.Now, InSync: true}
}

// Validate checks c: Params valid, Slots in 1..fleet.MaxSlots, valid
// health limits, no empty model name, a clock.
func (c *Config) Validate() error {
	var errs []error
	if err := (fleet.Config{Params: c.Params, Slots: c.Slots}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("localfleet: %w", err))
	}
	if err := c.Health.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("localfleet: %w", err))
	}
	for _, m := range c.Models {
		if strings.TrimSpace(m) == "" {
			errs = append(errs, errors.New("localfleet: an empty model name in the models followed"))
		}
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("localfleet: no clock (DefaultConfig's is time.Now)"))
	}
	return errors.Join(errs...)
}
