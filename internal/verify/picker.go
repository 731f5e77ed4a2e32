package verify

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/internal/debugapi"
)

// MaxPickerSilence is how long another picker's bookings stream may be
// silent (its batches and heartbeats, one a second) before "pickers
// agree" fails.
const MaxPickerSilence = 5.0 // seconds

// PickerFacts is what verify saw of the picker itself.
type PickerFacts struct {
	// GossipInsecure: the picker's /debug/endpoints says its own gossip
	// runs without a keyring off loopback (--gossip-insecure).
	GossipInsecure bool
	// PublicAdminStatus is the status the picker's public port answered
	// GET /debug/endpoints with; 0 when it did not answer. Only 404 keeps
	// the admin surface off the public port.
	PublicAdminStatus int
	// PublicAdminErr, when set, is why the public port did not answer.
	PublicAdminErr string
	// SharesBookings and Pickers are what /debug/endpoints says of the
	// bookings it shares with the other pickers.
	SharesBookings bool
	Pickers        []debugapi.PeerPicker
}

// JudgePicker checks the picker itself: its gossip is encrypted (or on
// loopback), and its public port does not serve the admin surface.
func JudgePicker(f PickerFacts) []Check {
	gossip := Check{Name: "picker gossip encrypted", OK: true, Detail: "the picker's gossip is encrypted or on loopback"}
	if f.GossipInsecure {
		gossip.OK, gossip.Detail = false, "the picker gossips without a keyring off loopback (--gossip-insecure)"
		gossip.Cause = "anyone who reaches its gossip port can join and advertise endpoints: give every member --gossip-key-file"
	}
	admin := Check{Name: "picker admin private", OK: true, Detail: "the public port answers 404 for /debug/endpoints"}
	switch {
	case f.PublicAdminErr != "":
		admin.OK, admin.Detail = false, "the public port did not answer: "+f.PublicAdminErr
		admin.Cause = "verify reached the admin port but not --picker: check the URL"
	case f.PublicAdminStatus != 404:
		admin.OK, admin.Detail = false, fmt.Sprintf("the public port answers %d for /debug/endpoints", f.PublicAdminStatus)
		admin.Cause = "every pod's address and load is served to clients: run a picker that serves its admin surface on --admin-listen only"
	}
	return []Check{gossip, admin, judgePickersAgree(f)}
}

// judgePickersAgree checks that the picker follows every other picker it
// knows of, each stream up and heard from within MaxPickerSilence: then
// each decision counts the others' picks in flight. With no other picker
// known, there is nothing to agree with.
func judgePickersAgree(f PickerFacts) Check {
	c := Check{Name: "pickers agree", OK: true}
	if !f.SharesBookings {
		c.Detail = "the picker shares no bookings (--peer-listen empty, or neither gossip nor --peer-pickers): with one picker, nothing to agree with"
		return c
	}
	var bad []string
	n := 0
	for _, p := range f.Pickers {
		switch {
		case p.State == debugapi.PeerSelf:
			continue
		case p.State != debugapi.PeerFollowing:
			why := p.State
			if p.Error != "" {
				why += ": " + p.Error
			}
			bad = append(bad, fmt.Sprintf("%s (%s)", p.Address, why))
		case p.LastBatchSeconds != nil && *p.LastBatchSeconds > MaxPickerSilence:
			bad = append(bad, fmt.Sprintf("%s (silent for %.1f s)", p.Address, *p.LastBatchSeconds))
		}
		n++
	}
	c.Figure = fmt.Sprintf("%d/%d", n-len(bad), n)
	switch {
	case len(bad) > 0:
		c.OK, c.Detail = false, "the picker cannot follow the bookings of "+strings.Join(bad, ", ")
		c.Cause = "each picker counts only its own picks there until the engines report: have each listen on a routable address (--peer-listen, e.g. :9001; the default is loopback) open to the others (NetworkPolicy), and give them one TLS setup (--peer-tls-cert, --peer-tls-key, --peer-tls-ca)"
	case n == 0:
		c.Detail = "no other picker found (gossip, --peer-pickers): with one picker, nothing to agree with"
	default:
		c.Detail = fmt.Sprintf("the picker follows the bookings of all %d other pickers", n)
	}
	return c
}
