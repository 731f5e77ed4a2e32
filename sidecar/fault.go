package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip"
)

// Fault injection (Config.FaultInjection, off by default): for fault
// benchmarks and tests, never for a deployment.

// faultBodyLimit bounds a fault switch's request body.
const faultBodyLimit = 1 << 10

// faultTransport, with fault injection on, replaces the gossip transport
// with one that can be cut off (gossip.Partitionable) on the configured
// bind address and exact port.
func (s *Sidecar) faultTransport() error {
	if !s.cfg.FaultInjection || s.cfg.Gossip == nil {
		return nil
	}
	t, err := gossip.NewPartitionable(s.cfg.Gossip.BindAddr, s.cfg.Gossip.BindPort)
	if err != nil {
		return fmt.Errorf("fault injection: gossip transport on %s:%d: %w", s.cfg.Gossip.BindAddr, s.cfg.Gossip.BindPort, err)
	}
	g := *s.cfg.Gossip
	g.Transport = t
	s.cfg.Gossip, s.partition = &g, t
	s.log.Warn("fault injection on: POST /debug/fault/gossip can partition this sidecar's gossip")
	return nil
}

// gossipFault is POST /debug/fault/gossip's body: {"partitioned": true}
// cuts the sidecar's gossip off (every packet in and out dropped, every
// stream refused), false heals it.
type gossipFault struct {
	Partitioned *bool `json:"partitioned"`
}

// parseGossipFault validates a fault switch's body: one JSON object with
// the boolean "partitioned", nothing else.
func parseGossipFault(body []byte) (bool, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var f gossipFault
	if err := dec.Decode(&f); err != nil {
		return false, fmt.Errorf("want {\"partitioned\": true|false}: %w", err)
	}
	if dec.More() {
		return false, errors.New("want one JSON object")
	}
	if f.Partitioned == nil {
		return false, errors.New(`"partitioned" (true or false) is required`)
	}
	return *f.Partitioned, nil
}

// handleGossipFault is POST /debug/fault/gossip.
func (s *Sidecar) handleGossipFault(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, faultBodyLimit))
	if err != nil {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": fmt.Sprintf("body over %d bytes", faultBodyLimit)})
		return
	}
	cut, err := parseGossipFault(body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	if cut {
		s.partition.Cut()
	} else {
		s.partition.Heal()
	}
	s.log.Warn("fault injection: gossip", zap.Bool("partitioned", cut))
	writeJSON(w, http.StatusOK, map[string]bool{"partitioned": cut})
}
