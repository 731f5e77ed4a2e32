package extproc

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Mode is a body send mode of Envoy's ext_proc filter
// (envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode).
// The values are Envoy's enum numbers, so the shell converts by value.
type Mode int

// The body send modes.
const (
	None            Mode = 0 // the body is not sent
	Streamed        Mode = 1 // in pieces, one answer each
	Buffered        Mode = 2 // whole, in one message
	BufferedPartial Mode = 3 // one message, possibly cut at the gateway's buffer limit
	FullDuplex      Mode = 4 // FULL_DUPLEX_STREAMED: in pieces, answered as the server chooses
	GRPC            Mode = 5 // gRPC messages (not supported: an error)
)

// String is the mode's name as Envoy's configuration spells it.
func (m Mode) String() string {
	switch m {
	case None:
		return "NONE"
	case Streamed:
		return "STREAMED"
	case Buffered:
		return "BUFFERED"
	case BufferedPartial:
		return "BUFFERED_PARTIAL"
	case FullDuplex:
		return "FULL_DUPLEX_STREAMED"
	case GRPC:
		return "GRPC"
	}
	return fmt.Sprintf("mode %d", int(m))
}

// ParseMode reads a mode as a flag gives it: full-duplex-streamed,
// streamed or buffered (Envoy's names, any case, are taken too).
func ParseMode(s string) (Mode, error) {
	switch s {
	case "full-duplex-streamed", "FULL_DUPLEX_STREAMED":
		return FullDuplex, nil
	case "streamed", "STREAMED":
		return Streamed, nil
	case "buffered", "BUFFERED":
		return Buffered, nil
	}
	return 0, fmt.Errorf("body mode %q: want full-duplex-streamed, streamed or buffered", s)
}

// Protocol is how the gateway's filter sends bodies: what Envoy puts in
// ProcessingRequest.protocol_config on a stream's first message.
type Protocol struct {
	RequestBody, ResponseBody Mode
	// BodyWithoutWaiting: in STREAMED mode the gateway sends the request
	// body as it arrives, without waiting for the answer to the headers
	// (send_body_without_waiting_for_header_response).
	BodyWithoutWaiting bool
}

// Config configures the endpoint picker. Start from DefaultConfig: a zero
// field is invalid, not a default, unless its comment says otherwise, and
// Validate says which.
type Config struct {
	// Fallbacks is how many endpoints follow the picked one in
	// x-gateway-destination-endpoint, for the gateway's retries: the
	// next best by the same decision. 0..7 (an InferencePool has at most
	// 8 target ports a pod, and rarely fewer pods); 0 is valid (none).
	// Default 2.
	Fallbacks int
	// ShedWaiting, when positive, sheds a request (429) when every
	// routable candidate endpoint has at least this many requests queued:
	// its engine's last reported waiting requests plus this picker's picks
	// that report does not cover yet. 0 (the default) never sheds.
	ShedWaiting float64
	// BodyTimeout bounds the wait from a request's headers to the end of
	// its body; past it the stream ends with DEADLINE_EXCEEDED. Default
	// 60 s (the HTTP API gives a client a minute to send its request).
	BodyTimeout time.Duration
	// Assume is the body mode for both directions when the gateway does not
	// say (no protocol_config: Envoy before 1.35, other data planes).
	// Default FULL_DUPLEX_STREAMED, what GIE's endpoint picker and the
	// gateways integrating it (Istio, kgateway, Envoy Gateway) use.
	Assume Mode
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Fallbacks: 2, BodyTimeout: time.Minute, Assume: FullDuplex}
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []error
	if c.Fallbacks < 0 || c.Fallbacks > 7 {
		errs = append(errs, fmt.Errorf("--ext-proc-fallbacks %d: want 0..7", c.Fallbacks))
	}
	if !(c.ShedWaiting >= 0) || math.IsInf(c.ShedWaiting, 0) {
		errs = append(errs, fmt.Errorf("--ext-proc-shed-waiting %v: want a finite count ≥ 0 (0 never sheds)", c.ShedWaiting))
	}
	if c.BodyTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--ext-proc-body-timeout %v: want a positive duration", c.BodyTimeout))
	}
	switch c.Assume {
	case FullDuplex, Streamed, Buffered:
	default:
		errs = append(errs, fmt.Errorf("--ext-proc-assume-body-mode %v: want full-duplex-streamed, streamed or buffered", c.Assume))
	}
	return errors.Join(errs...)
}

// Assumed is the protocol assumed when the gateway does not say: c.Assume
// both ways; in STREAMED mode, a gateway that waits for the header answer
// (Envoy's default).
func (c *Config) Assumed() Protocol {
	return Protocol{RequestBody: c.Assume, ResponseBody: c.Assume}
}
