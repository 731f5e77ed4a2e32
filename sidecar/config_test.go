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
