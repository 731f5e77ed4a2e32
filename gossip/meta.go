package gossip

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MetaLimit is memberlist's bound on node metadata.
const MetaLimit = 512

// Bounds on the models a member advertises (Meta.Models).
const (
	// MaxModels is how many model names one member may advertise.
	MaxModels = 8
	// MaxModelLen is the longest model name advertised, in bytes.
	MaxModelLen = 256
)

// Roles.
const (
	RoleSidecar = "sidecar"
	RolePicker  = "picker"
)

// Digest is one served endpoint's summary position.
type Digest struct {
	Endpoint string `json:"e"`
	Epoch    uint64 `json:"p,omitempty"`
	Seq      uint64 `json:"s,omitempty"`
}

// Meta is what a member advertises. Every key is optional but the role;
// a field a member leaves out reads as its zero value, and keys this
// version does not know (a newer member's) are ignored.
type Meta struct {
	Role  string `json:"r"`
	GRPC  string `json:"g,omitempty"` // gRPC address: a sidecar's summary stream, a picker's bookings stream (--peer-listen)
	Group string `json:"i,omitempty"` // identity group
	// Models are the model names the member's endpoints serve, as its
	// sidecar reports them (EndpointInfo.model), all of them or none:
	// a picker following only some models (--models) dials a sidecar
	// only when one of these is among them. None (an older sidecar, or
	// names that did not fit, see AdvertisedModels) means unknown: the
	// picker dials it and asks, as it did before models were advertised.
	Models    []string `json:"m,omitempty"`
	Endpoints []Digest `json:"d,omitempty"`
}

// ErrMetaTooLarge reports metadata beyond MetaLimit.
var ErrMetaTooLarge = errors.New("gossip: node metadata too large")

// AdvertisedModels returns the model names to advertise for endpoints
// serving names: each distinct non-empty name once, sorted; or nil (the
// models unknown to others) when they cannot all be advertised — more
// than MaxModels, one longer than MaxModelLen, or not printable UTF-8.
// Never a part of them: a picker would skip a sidecar serving a model it
// follows that the list left out.
func AdvertisedModels(names []string) []string {
	var out []string
	for _, n := range names {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	if validModels(out) != nil {
		return nil
	}
	return out
}

// validModels checks advertised model names: at most MaxModels, each
// non-empty, at most MaxModelLen bytes of printable UTF-8, none twice.
func validModels(models []string) error {
	if len(models) > MaxModels {
		return fmt.Errorf("gossip: %d models advertised, more than %d", len(models), MaxModels)
	}
	for i, m := range models {
		switch {
		case m == "":
			return errors.New("gossip: an empty model name")
		case len(m) > MaxModelLen:
			return fmt.Errorf("gossip: a model name of %d bytes, longer than %d", len(m), MaxModelLen)
		case !utf8.ValidString(m) || strings.ContainsFunc(m, func(r rune) bool { return !unicode.IsPrint(r) }):
			return fmt.Errorf("gossip: model name %q is not printable UTF-8", m)
		case slices.Contains(models[:i], m):
			return fmt.Errorf("gossip: model %q advertised twice", m)
		}
	}
	return nil
}

// Encode returns m's wire form, or ErrMetaTooLarge (wrapped).
func (m Meta) Encode() ([]byte, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > MetaLimit {
		return nil, fmt.Errorf("%w: %d bytes exceed %d (too many endpoints or names too long)", ErrMetaTooLarge, len(b), MetaLimit)
	}
	return b, nil
}

// DecodeMeta parses and validates metadata received from another member.
// Keys it does not know are ignored, so a member reads the metadata of a
// newer one; a field an older member leaves out reads as its zero value
// (no Models: the models unknown).
func DecodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) > MetaLimit {
		return m, fmt.Errorf("gossip: metadata of %d bytes exceeds %d", len(b), MetaLimit)
	}
	if len(b) == 0 {
		return m, fmt.Errorf("gossip: empty metadata")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("gossip: metadata: %w", err)
	}
	if dec.More() {
		return m, fmt.Errorf("gossip: trailing bytes after the metadata")
	}
	return m, m.validate()
}

func (m Meta) validate() error {
	switch m.Role {
	case RoleSidecar, RolePicker:
	default:
		return fmt.Errorf("gossip: unknown role %q", m.Role)
	}
	if m.GRPC != "" {
		if _, port, err := net.SplitHostPort(m.GRPC); err != nil || port == "" {
			return fmt.Errorf("gossip: gRPC address %q is not host:port", m.GRPC)
		}
	}
	if err := validModels(m.Models); err != nil {
		return err
	}
	for _, d := range m.Endpoints {
		if d.Endpoint == "" {
			return fmt.Errorf("gossip: endpoint digest without an endpoint")
		}
	}
	return nil
}
