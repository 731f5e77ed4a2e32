package sidecar_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestGossipAdvertisesModels: the sidecar's gossip metadata carries its
// gRPC address and the model its engine serves (as /v1/models names it),
// which pickers sharded by model read before dialling it.
func TestGossipAdvertisesModels(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	cfg := sidecarConfig(e)
	g := gossip.LocalConfig("models-sidecar")
	g.BindPort = testnet.FreePort(t)
	cfg.Gossip = &g
	s := startSidecar(t, cfg)
	model := s.State()[0].Identity.Model
	if model == "" {
		t.Fatal("the sidecar learnt no model")
	}
	og := gossip.LocalConfig("models-observer")
	og.Join = []string{fmt.Sprintf("127.0.0.1:%d", g.BindPort)}
	obs, err := gossip.New(og, gossip.Meta{Role: gossip.RolePicker}, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.Kill() })
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, m := range obs.Members() {
			if m.Name != "models-sidecar" {
				continue
			}
			if m.MetaErr != nil || m.Meta.GRPC != s.GRPCAddr() || !slices.Equal(m.Meta.Models, []string{model}) {
				return fmt.Errorf("the sidecar's metadata %+v (%v), want gRPC %s and models [%s]", m.Meta, m.MetaErr, s.GRPCAddr(), model)
			}
			return nil
		}
		return fmt.Errorf("the observer does not see the sidecar yet")
	})
}
