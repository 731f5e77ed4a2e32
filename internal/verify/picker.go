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
	// ExtProc is verify's probe of the picker's endpoint picker (zero
	// when it serves none).
	ExtProc ExtProcFacts
	// EnginePriority is what /debug/endpoints says of --engine-priority
	// (nil: off).
	EnginePriority *debugapi.EnginePriority
}

// ExtProcService is the service name the endpoint picker's gRPC health
// reports on: SERVING while the picker can route.
const ExtProcService = "envoy.service.ext_proc.v3.ExternalProcessor"

// ExtProcFacts is verify's probe of the endpoint picker's gRPC health
// (grpc.health.v1, service ExtProcService).
type ExtProcFacts struct {
	// Listen is the address the picker's /debug/endpoints says it
	// listens on ("": it serves no endpoint picker, nothing to probe).
	Listen string
	// Address is the address verify dialled (Listen, an unspecified host
	// replaced by the picker's, or --ext-proc).
	Address string
	// Status is the health answer (SERVING, NOT_SERVING, …; "" none).
	Status string
	// Err is why the probe got no answer.
	Err string
	// NotProbed, when set, is why verify did not probe it.
	NotProbed string
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
	checks := []Check{gossip, admin, judgePickersAgree(f)}
	if f.ExtProc.Listen != "" {
		checks = append(checks, judgeExtProc(f.ExtProc))
	}
	if f.EnginePriority != nil {
		checks = append(checks, judgeEnginePriority(*f.EnginePriority))
	}
	return checks
}

// judgeEnginePriority checks that no engine refused the priority the
// picker sets (--engine-priority): one that did runs
// --scheduling-policy fcfs, and its requests run unprioritised.
func judgeEnginePriority(e debugapi.EnginePriority) Check {
	c := Check{Name: "engine priority", OK: true, Detail: "no engine refused the priority the picker sets (--engine-priority)"}
	if len(e.RefusedBy) > 0 {
		c.OK, c.Detail = false, "engines refused the request priority the picker sets: "+strings.Join(e.RefusedBy, ", ")
		c.Cause = "they run --scheduling-policy fcfs (vLLM's default): their requests are resent without a priority, first come first served; start every engine with --scheduling-policy priority, or run the picker without --engine-priority"
	}
	return c
}

// judgeExtProc checks the endpoint picker's gRPC health: it passes when
// it answers SERVING (it can route); fails naming the address and the
// status, or why it did not answer.
func judgeExtProc(f ExtProcFacts) Check {
	c := Check{Name: "endpoint picker health", Endpoint: f.Address, OK: true}
	switch {
	case f.NotProbed != "":
		c.Detail = fmt.Sprintf("the endpoint picker on %s was not probed: %s", f.Listen, f.NotProbed)
	case f.Err != "":
		c.OK, c.Detail = false, fmt.Sprintf("the endpoint picker's gRPC health at %s did not answer: %s", f.Address, f.Err)
		c.Cause = "its port (--ext-proc-listen) is not reachable from here: check the address, the Service and the NetworkPolicy (or give verify the address with --ext-proc)"
	case f.Status != "SERVING":
		c.OK, c.Detail = false, fmt.Sprintf("the endpoint picker's gRPC health at %s answers %s for %s", f.Address, f.Status, ExtProcService)
		c.Cause = "it cannot route (no routable endpoint, or a gossip name conflict: see the picker's /readyz): the gateway's requests get no destination"
	default:
		c.Detail = fmt.Sprintf("the endpoint picker's gRPC health at %s answers SERVING", f.Address)
	}
	return c
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
