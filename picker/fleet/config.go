package fleet

import (
	"fmt"

	"github.com/kvroute/kvroute/internal/summary"
)

// MaxSlots is the most endpoints one identity group can be configured to
// hold. The index holds m/8 bytes per endpoint and tier (128 KiB at
// 65,536 blocks), so 16,384 endpoints of one model is 2 GiB a tier.
const MaxSlots = 16384

// DefaultSlots is the default bound on one group's endpoints: a
// 1,000-endpoint model fits, in 128 MiB of index per tier at 65,536
// blocks an endpoint.
const DefaultSlots = 1024

// Config configures a State.
//
// One rule for defaults: DefaultConfig returns every documented default,
// and a zero value is never a default but invalid — Validate rejects it and
// New does not fill it in. Start from DefaultConfig and set Params, which
// has no default.
type Config struct {
	// Params are the fleet-wide summary parameters; endpoints whose
	// sidecar advertises others are refused (summary_params). No default:
	// the summaries' size is the fleet's choice and must be set.
	Params summary.Params
	// Slots bounds the endpoints of one identity group, 1..MaxSlots; a
	// group's next endpoint is refused (group_full). A group's slots
	// grow as its endpoints come, so the bound costs nothing until used.
	// Default DefaultSlots (1,024).
	Slots int
}

// DefaultConfig returns the defaults: Slots DefaultSlots, Params unset.
func DefaultConfig() Config { return Config{Slots: DefaultSlots} }

// Validate checks c: Params must be valid and Slots in 1..MaxSlots.
func (c Config) Validate() error {
	if err := c.Params.Validate(); err != nil {
		return err
	}
	if c.Slots < 1 || c.Slots > MaxSlots {
		return fmt.Errorf("fleet: %d slots per group: want 1..%d", c.Slots, MaxSlots)
	}
	return nil
}
