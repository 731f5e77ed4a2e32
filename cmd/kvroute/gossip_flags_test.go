package main

import (
	"os"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/gossip"
)

// TestGossipNameAndPortFlags: with no gossip flags, the sidecar and the
// picker name themselves <host>-{role}-{port} and may fall back through 16
// ports from 7946; --node-name replaces the name; an advertised port pins
// the bind port, and asking for a range with one is refused.
func TestGossipNameAndPortFlags(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	commands := map[string]func(args ...string) (*gossip.Config, error){
		"sidecar": func(args ...string) (*gossip.Config, error) {
			cmd, cfg, finish := sidecarCommand()
			if err := cmd.ParseFlags(args); err != nil {
				return nil, err
			}
			return cfg.Gossip, finish()
		},
		"picker": func(args ...string) (*gossip.Config, error) {
			cmd, cfg, finish := pickerCommand()
			if err := cmd.ParseFlags(args); err != nil {
				return nil, err
			}
			return cfg.Gossip, finish()
		},
	}
	for name, parse := range commands {
		g, err := parse()
		if err != nil || g == nil {
			t.Fatalf("%s defaults: %v", name, err)
		}
		if g.NodeName != host+"-{role}-{port}" || g.BindPort != 7946 || g.BindPorts != 16 || g.AdvertisePort != 0 {
			t.Errorf("%s defaults: name %q, port %d, ports %d", name, g.NodeName, g.BindPort, g.BindPorts)
		}
		if g, err = parse("--node-name", "pod-a", "--gossip-ports", "1"); err != nil || g.NodeName != "pod-a" || g.BindPorts != 1 {
			t.Errorf("%s --node-name pod-a --gossip-ports 1: %+v %v", name, g, err)
		}
		if g, err = parse("--gossip-advertise", "10.0.0.5:7946"); err != nil || g.BindPorts != 1 || g.AdvertisePort != 7946 {
			t.Errorf("%s --gossip-advertise: %+v %v", name, g, err)
		}
		if _, err = parse("--gossip-advertise", "10.0.0.5:7946", "--gossip-ports", "4"); err == nil || !strings.Contains(err.Error(), "--gossip-ports") {
			t.Errorf("%s: a port range with an advertised port: %v", name, err)
		}
		if _, err = parse("--gossip-ports", "0"); err == nil || !strings.Contains(err.Error(), "--gossip-ports") {
			t.Errorf("%s --gossip-ports 0: %v", name, err)
		}
	}
}
