package gossip

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
)

// MetaLimit is memberlist's bound on node metadata.
const MetaLimit = 512

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

// Meta is what a member advertises.
type Meta struct {
	Role      string   `json:"r"`
	GRPC      string   `json:"g,omitempty"` // gRPC address pickers dial (sidecars)
	Group     string   `json:"i,omitempty"` // identity group
	Endpoints []Digest `json:"d,omitempty"`
}

// ErrMetaTooLarge reports metadata beyond MetaLimit.
var ErrMetaTooLarge = errors.New("gossip: node metadata too large")

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
func DecodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) > MetaLimit {
		return m, fmt.Errorf("gossip: metadata of %d bytes exceeds %d", len(b), MetaLimit)
	}
	if len(b) == 0 {
		return m, fmt.Errorf("gossip: empty metadata")
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
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
	for _, d := range m.Endpoints {
		if d.Endpoint == "" {
			return fmt.Errorf("gossip: endpoint digest without an endpoint")
		}
	}
	return nil
}
