package fleet

import (
	"fmt"

	"github.com/kvroute/kvroute/internal/summary"
)

// MaxSlots is the most endpoints one identity group can hold: the fleet
// index matches up to 256 slots in one pass.
const MaxSlots = 256

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
	// group's next endpoint is refused (group_full). Default 256.
	Slots int
}

// DefaultConfig returns the defaults: Slots 256, Params unset.
func DefaultConfig() Config { return Config{Slots: MaxSlots} }

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
