package sidecar

import (
	"testing"

	"github.com/kvroute/kvroute/gossip"
)

// TestDebugURL: the debug server's URL as others reach it.
func TestDebugURL(t *testing.T) {
	for _, tc := range []struct {
		name, advertise, listen string
		gossip                  *gossip.Config
		want                    string
	}{
		{"advertised", "10.0.0.9:18090", "0.0.0.0:8090", nil, "http://10.0.0.9:18090"},
		{"a specific listen address", "", "127.0.0.1:8090", nil, "http://127.0.0.1:8090"},
		{"every interface, the gossip advertise host", "", "[::]:8090", &gossip.Config{BindAddr: "0.0.0.0", AdvertiseAddr: "10.1.2.3"}, "http://10.1.2.3:8090"},
		{"every interface, the gossip bind host", "", "0.0.0.0:8090", &gossip.Config{BindAddr: "10.1.2.4"}, "http://10.1.2.4:8090"},
		{"every interface, an IPv6 pod", "", "[::]:8090", &gossip.Config{AdvertiseAddr: "fd00::7"}, "http://[fd00::7]:8090"},
		{"every interface, no host known", "", "0.0.0.0:8090", &gossip.Config{BindAddr: "0.0.0.0"}, ""},
		{"every interface, no gossip", "", "[::]:8090", nil, ""},
	} {
		cfg := Config{AdminAdvertise: tc.advertise, Gossip: tc.gossip}
		if got := debugURL(cfg, tc.listen); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
