package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestGossipOffLoopbackNeedsAKey: by default gossip binds loopback (and
// runs for processes sharing a host); a bind off loopback without a
// keyring refuses to start, saying what to give, on the sidecar and the
// picker alike; a keyring or --gossip-insecure lets it start.
func TestGossipOffLoopbackNeedsAKey(t *testing.T) {
	type command func() (*cobra.Command, func() error)
	sidecar := func() (*cobra.Command, func() error) {
		cmd, _, finish := sidecarCommand()
		return cmd, finish
	}
	picker := func() (*cobra.Command, func() error) {
		cmd, _, finish := pickerCommand()
		return cmd, finish
	}
	for name, c := range map[string]command{"sidecar": sidecar, "picker": picker} {
		for _, tc := range []struct {
			args []string
			ok   bool
		}{
			{nil, true}, // the default: loopback
			{[]string{"--gossip-bind", "0.0.0.0:7946"}, false},
			{[]string{"--gossip-bind", "[::]:7946"}, false},
			{[]string{"--gossip-bind", "10.1.2.3:7946"}, false},
			{[]string{"--gossip-bind", "0.0.0.0:7946", "--gossip-key-file", "/etc/keyring"}, true},
			{[]string{"--gossip-bind", "0.0.0.0:7946", "--gossip-insecure"}, true},
		} {
			cmd, finish := c()
			args := tc.args
			if name == "picker" {
				args = append(args, "--join", "127.0.0.1:7946")
			}
			if err := cmd.ParseFlags(args); err != nil {
				t.Fatal(err)
			}
			err := finish()
			if tc.ok != (err == nil) {
				t.Errorf("%s %v: %v", name, tc.args, err)
			}
			if err != nil && !(strings.Contains(err.Error(), "--gossip-key-file") && strings.Contains(err.Error(), "--gossip-insecure")) {
				t.Errorf("%s %v: the refusal does not say what to give: %v", name, tc.args, err)
			}
		}
	}
}
