package verify

import (
	"strings"
	"testing"
)

func TestJudgeProbe(t *testing.T) {
	good := ProbeResult{Name: "chat", FirstEndpoint: "e1", SecondEndpoint: "e1", PromptTokens: 130, BlockSize: 16,
		Predicted: 128, EngineCached: 128, Keys: 8, KeysIndexed: 8}
	for _, tc := range []struct {
		name   string
		mutate func(*ProbeResult)
		failed []string
	}{
		{"healthy", func(*ProbeResult) {}, nil},
		{"block-aligned prompt: the last block is never reported", func(p *ProbeResult) { p.PromptTokens, p.Predicted, p.EngineCached = 128, 128, 112 }, nil},
		{"moved", func(p *ProbeResult) { p.SecondEndpoint = "e2" }, []string{"probe chat same endpoint"}},
		{"predicted less", func(p *ProbeResult) { p.Predicted = 64 }, []string{"probe chat prediction"}},
		{"engine without details", func(p *ProbeResult) { p.EngineCached = 0 }, []string{"probe chat prediction"}},
		{"keys missing", func(p *ProbeResult) { p.KeysIndexed = 3 }, []string{"probe chat keys on sidecar"}},
		{"no keys", func(p *ProbeResult) { p.Keys, p.KeysIndexed = 0, 0 }, []string{"probe chat keys on sidecar"}},
		{"salt leaks", func(p *ProbeResult) { p.OtherSaltCached = 128 }, []string{"probe chat other salt"}},
		{"keys not looked up", func(p *ProbeResult) { p.KeysError = "connection refused" }, []string{"probe chat keys on sidecar"}},
		{"could not run", func(p *ProbeResult) { p.Err = "status 404" }, []string{"probe chat"}},
	} {
		p := good
		tc.mutate(&p)
		checks := JudgeProbe(p)
		var got []string
		for _, c := range Failed(checks) {
			got = append(got, c.Name)
			if c.Cause == "" || c.Detail == "" {
				t.Errorf("%s: %+v lacks its numbers or cause", tc.name, c)
			}
		}
		if strings.Join(got, "|") != strings.Join(tc.failed, "|") {
			t.Errorf("%s: failed %q, want %q", tc.name, got, tc.failed)
		}
	}
}
