package enginesim_test

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/test/enginesim"
)

// offloading is an OffloadingConnector config with extra as its
// kv_connector_extra_config.
func offloading(extra string) string {
	return `{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":` + extra + `}`
}

// TestParseKVTransferConfig: vLLM's --kv-transfer-config, its defaults and
// what the simulated connector reads of it.
func TestParseKVTransferConfig(t *testing.T) {
	for _, s := range []string{"", " ", "null", `{}`, `{"kv_role":"kv_both"}`} {
		k, err := enginesim.ParseKVTransferConfig(s)
		if err != nil || k.Enabled() {
			t.Errorf("%q: %+v, %v: want no connector", s, k, err)
		}
	}
	k, err := enginesim.ParseKVTransferConfig(offloading(`{"cpu_bytes_to_use":960e9}`))
	if err != nil {
		t.Fatal(err)
	}
	want := enginesim.OffloadConfig{SpecName: enginesim.CPUOffloadingSpec, CPUBytes: 960e9, EvictionPolicy: "lru", PromptOnly: true}
	if !k.Enabled() || k.P2PEnabled() || k.Role != "kv_both" || k.Offload != want || len(k.Warnings) != 0 {
		t.Errorf("defaults: %+v, want %+v", k, want)
	}
	if got := k.OffloadBlockTokens(16); got != 16 {
		t.Errorf("offload block %d, want the GPU block", got)
	}
	k, err = enginesim.ParseKVTransferConfig(offloading(`{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":"1000000",
		"block_size":64,"offload_prompt_only":false,"self_describing_kv_events":true,"eviction_policy":"lru","store_threshold":1,
		"max_tracker_size":64000,"secondary_tiers":[{"type":"p2p","host":"10.0.0.5","port":6000,"backends":["UCX"],"num_threads":4,
		"unbound_store_timeout_s":60,"extra":1}],"lazy":true}`))
	if err != nil {
		t.Fatal(err)
	}
	o := k.Offload
	if !k.P2PEnabled() || o.CPUBytes != 1e6 || o.BlockSize != 64 || o.PromptOnly || !o.SelfDescribing || o.StoreThreshold != 1 ||
		o.P2P.Host != "10.0.0.5" || o.P2P.Port != 6000 || k.OffloadBlockTokens(16) != 64 {
		t.Errorf("tiering: %+v %+v", k, o.P2P)
	}
	if w := strings.Join(k.Warnings, "\n"); !strings.Contains(w, `"lazy"`) || !strings.Contains(w, `"extra"`) {
		t.Errorf("warnings %q: want the unread keys", w)
	}
	k, err = enginesim.ParseKVTransferConfig(offloading(`{"cpu_bytes_to_use":1,"blocks_per_chunk":4,"secondary_tiers":[{"type":"p2p"}]}`))
	if err != nil || k.P2PEnabled() || k.OffloadBlockTokens(16) != 64 || len(k.Warnings) != 1 || !strings.Contains(k.Warnings[0], "TieringOffloadingSpec") {
		t.Errorf("secondary_tiers on the CPU spec: %+v, %v: want it ignored, with a warning", k, err)
	}
	k, err = enginesim.ParseKVTransferConfig(`{"kv_connector":"OffloadingConnector","kv_role":"kv_producer","engine_id":"e","kv_buffer_device":"cuda",
		"kv_buffer_size":1e9,"kv_rank":0,"kv_parallel_size":1,"kv_ip":"127.0.0.1","kv_port":14579,"kv_connector_module_path":null,
		"kv_load_failure_policy":"recompute","kv_connector_extra_config":{"cpu_bytes_to_use":1}}`)
	if err != nil || len(k.Warnings) != 1 || !strings.Contains(k.Warnings[0], "kv_both") {
		t.Errorf("vLLM's other fields: %+v, %v: want them accepted, the role warned", k, err)
	}
}

// TestKVTransferConfigRefused: what vLLM refuses, and what the simulation
// does not model, is an error naming the key.
func TestKVTransferConfigRefused(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{"kv_connector":"OffloadingConnector","kv_connector_extra_config":{"cpu_bytes_to_use":1}}`, "kv_role is required"},
		{`{"kv_connector":"OffloadingConnector","kv_role":"both","kv_connector_extra_config":{"cpu_bytes_to_use":1}}`, "kv_role"},
		{`{"kv_connector":"OffloadingConnector","kv_role":"kv_both","surprise":1}`, "surprise"},
		{`{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`, "not simulated"},
		{`{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_load_failure_policy":"maybe"}`, "kv_load_failure_policy"},
		{`{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":[]}`, "kv_connector_extra_config"},
		{`not json`, "--kv-transfer-config"},
		{offloading(`{}`), "cpu_bytes_to_use is required"},
		{offloading(`{"cpu_bytes_to_use":0}`), "cpu_bytes_to_use"},
		{offloading(`{"cpu_bytes_to_use":1.5}`), "cpu_bytes_to_use"},
		{offloading(`{"cpu_bytes_to_use":true}`), "cpu_bytes_to_use"},
		{offloading(`{"cpu_bytes_to_use":1,"block_size":64,"blocks_per_chunk":4}`), "only one of"},
		{offloading(`{"cpu_bytes_to_use":1,"blocks_per_chunk":0}`), "blocks_per_chunk"},
		{offloading(`{"cpu_bytes_to_use":1,"block_size":-16}`), "block_size"},
		{offloading(`{"cpu_bytes_to_use":1,"eviction_policy":"arc"}`), "arc is not modelled"},
		{offloading(`{"cpu_bytes_to_use":1,"eviction_policy":"fifo"}`), "eviction_policy"},
		{offloading(`{"cpu_bytes_to_use":1,"spec_name":"MySpec"}`), "spec_name"},
		{offloading(`{"cpu_bytes_to_use":1,"offload_prompt_only":"yes"}`), "offload_prompt_only"},
		{offloading(`{"cpu_bytes_to_use":1,"store_threshold":2}`), "store_threshold"},
		{offloading(`{"cpu_bytes_to_use":1,"spec_name":"TieringOffloadingSpec","secondary_tiers":[{"type":"fs"}]}`), "not simulated"},
		{offloading(`{"cpu_bytes_to_use":1,"spec_name":"TieringOffloadingSpec","secondary_tiers":[{"host":"h"}]}`), "type is required"},
		{offloading(`{"cpu_bytes_to_use":1,"spec_name":"TieringOffloadingSpec","secondary_tiers":[{"type":"p2p"},{"type":"p2p"}]}`), "second p2p"},
		{offloading(`{"cpu_bytes_to_use":1,"spec_name":"TieringOffloadingSpec","secondary_tiers":[{"type":"p2p","port":70000}]}`), "port"},
		{offloading(`{"cpu_bytes_to_use":1,"spec_name":"TieringOffloadingSpec","secondary_tiers":[{"type":"p2p","host":""}]}`), "host"},
		{offloading(`{"cpu_bytes_to_use":1,"spec_name":"TieringOffloadingSpec","secondary_tiers":{"type":"p2p"}}`), "secondary_tiers"},
	} {
		_, err := enginesim.ParseKVTransferConfig(c.json)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.json, err, c.want)
		}
	}
}

// TestKVTransferConfigValidate: the connector against the engine's other
// settings.
func TestKVTransferConfigValidate(t *testing.T) {
	tiering := func(extra string) enginesim.KVTransferConfig {
		k, err := enginesim.ParseKVTransferConfig(offloading(`{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":1,` + extra + `"secondary_tiers":[{"type":"p2p"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	for _, c := range []struct {
		name string
		edit func(*enginesim.Config)
		want string // "" valid
	}{
		{"block_size a multiple", func(c *enginesim.Config) { c.KVTransfer = tiering(`"block_size":64,`) }, ""},
		{"block_size not a multiple", func(c *enginesim.Config) { c.KVTransfer = tiering(`"block_size":40,`) }, "multiple of the GPU block"},
		{"pooling", func(c *enginesim.Config) { c.KVTransfer = tiering(""); c.Runner = enginesim.RunnerPooling }, "generative"},
		{"ports past 65535", func(c *enginesim.Config) {
			c.KVTransfer = tiering("")
			c.P2PSideChannelPort = 65535
			c.DataParallelSize = 2
		}, "port"},
		{"ephemeral with ranks", func(c *enginesim.Config) {
			c.KVTransfer = tiering("")
			c.P2PSideChannelPort = 0
			c.DataParallelSize = 2
		}, "ephemeral"},
		{"empty host", func(c *enginesim.Config) { c.KVTransfer = tiering(""); c.P2PSideChannelHost = "" }, "host"},
		{"no handshake time", func(c *enginesim.Config) { c.KVTransfer = tiering(""); c.P2PHandshakeTimeout = 0 }, "HANDSHAKE"},
	} {
		cfg := enginesim.DefaultConfig()
		cfg.BlockSize = 16
		c.edit(&cfg)
		err := cfg.Validate()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
