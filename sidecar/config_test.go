package sidecar

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/gossip"
)

// TestConfigValidate: the defaults are valid; a zero value is rejected
// unless its field gives it a meaning, and nothing is filled in.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"defaults", func(c *Config) {}, true},
		{"no replay, no topic, no gRPC", func(c *Config) { c.Replay, c.Topic, c.GRPCListen = "", "", "" }, true},
		{"a free debug port", func(c *Config) { c.AdminListen = "127.0.0.1:0" }, true},
		{"the zero Config", func(c *Config) { *c = Config{} }, false},
		{"no engine URL", func(c *Config) { c.EngineURL = "" }, false},
		{"no event endpoint", func(c *Config) { c.KVEvents = "" }, false},
		{"a replay endpoint without a scheme", func(c *Config) { c.Replay = "127.0.0.1:5558" }, false},
		{"no ranks", func(c *Config) { c.DataParallelSize = 0 }, false},
		{"no debug address", func(c *Config) { c.AdminListen = "" }, false},
		{"no capacity", func(c *Config) { c.Capacity = 0 }, false},
		{"no scrape interval", func(c *Config) { c.ScrapeInterval = 0 }, false},
		{"no scrape timeout", func(c *Config) { c.ScrapeTimeout = 0 }, false},
		{"no delta interval", func(c *Config) { c.DeltaInterval = 0 }, false},
		{"no replay timeout", func(c *Config) { c.ReplayTimeout = 0 }, false},
		{"no idle check", func(c *Config) { c.IdleCheck = 0 }, false},
		{"no startup timeout", func(c *Config) { c.StartupTimeout = 0 }, false},
		{"no stream window", func(c *Config) { c.StreamWindow = 0 }, false},
		{"a stream window below 100ms", func(c *Config) { c.StreamWindow = 50 * time.Millisecond }, false},
		{"no drain delay (leave at once)", func(c *Config) { c.DrainDelay = 0 }, true},
		{"a negative drain delay", func(c *Config) { c.DrainDelay = -time.Second }, false},
		{"a drain delay past 10m", func(c *Config) { c.DrainDelay = time.Hour }, false},
		{"a TLS cert without its key", func(c *Config) { c.GRPCTLSCert = "cert.pem" }, false},
		{"TLS with a client CA", func(c *Config) { c.GRPCTLSCert, c.GRPCTLSKey, c.GRPCClientCA = "cert.pem", "key.pem", "ca.pem" }, true},
		{"a client CA without TLS", func(c *Config) { c.GRPCClientCA = "ca.pem" }, false},
		{"TLS without gRPC", func(c *Config) { c.GRPCTLSCert, c.GRPCTLSKey, c.GRPCListen = "cert.pem", "key.pem", "" }, false},
		{"gossip without gRPC", func(c *Config) { g := gossip.DefaultConfig(); c.Gossip, c.GRPCListen = &g, "" }, false},
		{"fault injection without gossip", func(c *Config) { c.FaultInjection = true }, false},
		{"fault injection with a gossip port range", func(c *Config) { g := gossip.DefaultConfig(); c.Gossip, c.FaultInjection = &g, true }, false},
		{"fault injection with one gossip port", func(c *Config) {
			g := gossip.DefaultConfig()
			g.BindPorts = 1
			c.Gossip, c.FaultInjection = &g, true
		}, true},
		{"a scrape interval below 10ms", func(c *Config) { c.ScrapeInterval = time.Millisecond }, false},
		{"a P2P port", func(c *Config) { c.P2PPort = 5710 }, true},
		{"a negative P2P port", func(c *Config) { c.P2PPort = -1 }, false},
		{"a P2P port past 65535", func(c *Config) { c.P2PPort = 65536 }, false},
		{"the last rank's P2P port past 65535", func(c *Config) { c.P2PPort, c.DataParallelSize = 65535, 2 }, false},
	} {
		cfg := DefaultConfig()
		tc.edit(&cfg)
		before := cfg
		err := cfg.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate error %v, want ok=%v", tc.name, err, tc.ok)
		}
		if cfg != before {
			t.Errorf("%s: Validate changed the config", tc.name)
		}
	}
}

// TestKVSourceAddr: rank r's advertised P2P address is its engine URL's
// host and --p2p-port plus r, as vLLM binds it; none without a port.
func TestKVSourceAddr(t *testing.T) {
	for _, tc := range []struct {
		url        string
		port, rank int
		want       string
	}{
		{"http://10.0.1.5:8000", 0, 0, ""},
		{"http://10.0.1.5:8000", 5710, 0, "10.0.1.5:5710"},
		{"http://10.0.1.5:8001", 5710, 1, "10.0.1.5:5711"},
		{"http://[fd00::7]:8000", 5710, 3, "[fd00::7]:5713"},
		{"https://engine.pod.local", 7777, 0, "engine.pod.local:7777"},
	} {
		got, err := kvSourceAddr(tc.url, tc.port, tc.rank)
		if err != nil || got != tc.want {
			t.Errorf("kvSourceAddr(%q, %d, %d) = %q, %v; want %q", tc.url, tc.port, tc.rank, got, err, tc.want)
		}
	}
	if got, err := kvSourceAddr("http://:8000", 5710, 0); err == nil {
		t.Errorf("an engine URL without a host advertised %q", got)
	}
}
