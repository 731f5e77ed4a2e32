package main

import (
	"strings"
	"testing"
)

// TestPickerPerEndpointMetricsFlag: the picker exports three series an
// endpoint unless --per-endpoint-metrics (issue 37); the flag reaches the
// router's configuration, which hands it to the fleet view.
func TestPickerPerEndpointMetricsFlag(t *testing.T) {
	for args, want := range map[string]bool{"": false, "--per-endpoint-metrics": true, "--per-endpoint-metrics=false": false} {
		cmd, cfg, finish := pickerCommand()
		base := []string{"--listen", "127.0.0.1:0", "--grpc-listen", "", "--gossip-bind", "", "--sidecars", "127.0.0.1:9090"}
		if err := cmd.ParseFlags(append(base, strings.Fields(args)...)); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err != nil {
			t.Fatal(err)
		}
		if cfg.Router.PerEndpointMetrics != want {
			t.Errorf("%q: PerEndpointMetrics %v, want %v", args, cfg.Router.PerEndpointMetrics, want)
		}
	}
	cmd, _, _ := pickerCommand()
	if help := cmd.Flags().Lookup("per-endpoint-metrics").Usage; !strings.Contains(help, "three series") {
		t.Errorf("--per-endpoint-metrics's help does not say what an endpoint has without it: %q", help)
	}
}
