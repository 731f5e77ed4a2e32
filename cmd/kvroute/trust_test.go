package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPickerAllowRemoteEndpointsFlag: --allow-remote-endpoints (and its
// --config key) reaches the configuration, none by default; entries that
// are not networks stop the picker before it starts, each named.
func TestPickerAllowRemoteEndpointsFlag(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "picker.json")
	if err := os.WriteFile(conf, []byte(`{"allow-remote-endpoints": "192.0.2.0/24,198.51.100.7"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, nil},
		{[]string{"--allow-remote-endpoints", "10.0.0.0/8,fd00::/8"}, []string{"10.0.0.0/8", "fd00::/8"}},
		{[]string{"--allow-remote-endpoints", "10.0.0.0/8", "--allow-remote-endpoints", "10.1.2.3"}, []string{"10.0.0.0/8", "10.1.2.3"}},
		{[]string{"--config", conf}, []string{"192.0.2.0/24", "198.51.100.7"}},
	} {
		cmd, cfg, finish := pickerCommand()
		if err := cmd.ParseFlags(append([]string{"--sidecars", "127.0.0.1:9090", "--gossip-bind", ""}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.AllowRemoteEndpoints, tc.want) {
			t.Errorf("%v: %q, want %q", tc.args, cfg.AllowRemoteEndpoints, tc.want)
		}
	}
	for _, tc := range []struct{ value, want string }{
		{"10.0.0.0/33", `"10.0.0.0/33" is not a network`},
		{"10.0.0.0/8,", "an empty entry"},
		{"example.com", `"example.com" is not a network`},
		{"10.0.0.0/8,fd00::/200", `"fd00::/200"`},
	} {
		cmd, _, finish := pickerCommand()
		if err := cmd.ParseFlags([]string{"--sidecars", "127.0.0.1:9090", "--gossip-bind", "", "--allow-remote-endpoints", tc.value}); err != nil {
			t.Fatal(err)
		}
		err := finish()
		if err == nil || !strings.Contains(err.Error(), "--allow-remote-endpoints") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.value, err)
		}
	}
}
