package verify

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/debugapi"
)

// judged checks c's verdict, and that a failure has its numbers and a
// likely cause containing cause, a pass no cause.
func judged(t *testing.T, name string, c Check, ok bool, detail, cause string) {
	t.Helper()
	switch {
	case c.OK != ok:
		t.Errorf("%s: ok %v, want %v: %+v", name, c.OK, ok, c)
	case !strings.Contains(c.Detail, detail):
		t.Errorf("%s: detail %q lacks %q", name, c.Detail, detail)
	case ok && c.Cause != "":
		t.Errorf("%s: a pass with a cause: %+v", name, c)
	case !ok && (c.Cause == "" || !strings.Contains(c.Cause, cause)):
		t.Errorf("%s: cause %q lacks %q", name, c.Cause, cause)
	}
}

func TestJudgeSidecar(t *testing.T) {
	const e = "http://10.0.0.1:8000"
	for _, tc := range []struct {
		name          string
		f             SidecarFacts
		ok            bool
		detail, cause string
	}{
		{"its own sidecar", SidecarFacts{Endpoint: e, DebugURL: "http://10.0.0.1:9091", Follows: []string{e}},
			true, "debug endpoints answer at http://10.0.0.1:9091", ""},
		{"a sidecar of several ranks", SidecarFacts{Endpoint: e, DebugURL: "http://d", Follows: []string{"http://other", e}}, true, "http://d", ""},
		{"debug URL unknown", SidecarFacts{Endpoint: e}, false, "unknown", "--admin-advertise"},
		{"unknown URL beats an error", SidecarFacts{Endpoint: e, Err: "x"}, false, "unknown", "--admin-advertise"},
		{"unreachable", SidecarFacts{Endpoint: e, DebugURL: "http://d", Err: "connection refused"}, false, "connection refused", "not reachable"},
		{"another endpoint's sidecar", SidecarFacts{Endpoint: e, DebugURL: "http://127.0.0.1:9091", Follows: []string{"http://10.0.0.2:8000"}},
			false, "the sidecar at http://127.0.0.1:9091 follows other endpoints", "another sidecar"},
		{"a sidecar following nothing", SidecarFacts{Endpoint: e, DebugURL: "http://d"}, false, "follows other endpoints", "another sidecar"},
	} {
		c := JudgeSidecar(tc.f)
		if c.Name != "sidecar reachable" || c.Endpoint != e {
			t.Errorf("%s: %+v", tc.name, c)
		}
		judged(t, tc.name, c, tc.ok, tc.detail, tc.cause)
	}
}

func TestJudgeCachedDetails(t *testing.T) {
	for _, tc := range []struct {
		name          string
		f             DetailsFacts
		ok            bool
		detail, cause string
	}{
		{"details", DetailsFacts{PromptTokens: 130, CachedTokens: 128, Details: true}, true, "a repeated 130-token prompt reported 128 cached", ""},
		{"details, nothing cached", DetailsFacts{PromptTokens: 130, Details: true}, true, "reported 0 cached", ""},
		{"no details", DetailsFacts{PromptTokens: 130}, false, "a repeated 130-token prompt came back without prompt_tokens_details", "--enable-prompt-tokens-details"},
		{"no answer", DetailsFacts{Err: "status 500"}, false, "status 500", "did not answer"},
	} {
		tc.f.Endpoint = "http://e"
		c := JudgeCachedDetails(tc.f)
		if c.Name != "engine reports cached tokens" || c.Endpoint != "http://e" {
			t.Errorf("%s: %+v", tc.name, c)
		}
		judged(t, tc.name, c, tc.ok, tc.detail, tc.cause)
	}
}

func TestJudgeTokenParity(t *testing.T) {
	keys := []string{"a", "b", "c"}
	const mismatch = "tokenizes or templates the probe differently"
	for _, tc := range []struct {
		name          string
		f             TokenFacts
		ok            bool
		detail, cause string
	}{
		{"same keys", TokenFacts{EngineKeys: keys, PickerKeys: keys}, true,
			"the engine's tokens (chat/completions render, 50 tokens) give 3 block keys; the picker's 3; the first 3 agree", ""},
		{"another template", TokenFacts{EngineKeys: []string{"x", "y", "z"}, PickerKeys: keys}, false, "the first 0 agree", mismatch},
		{"diverging late", TokenFacts{EngineKeys: []string{"a", "b", "z"}, PickerKeys: keys}, false, "the first 2 agree", mismatch},
		{"engine has fewer", TokenFacts{EngineKeys: keys[:2], PickerKeys: keys}, false, "give 2 block keys; the picker's 3; the first 2 agree", mismatch},
		{"picker has fewer", TokenFacts{EngineKeys: keys, PickerKeys: keys[:1]}, false, "give 3 block keys; the picker's 1; the first 1 agree", mismatch},
		{"no keys at all", TokenFacts{}, false, "give 0 block keys; the picker's 0", mismatch},
		{"render failed", TokenFacts{RenderErr: "render: status 500", PickerKeys: keys}, false, "render: status 500", "could not render"},
		{"decision API failed", TokenFacts{PickerErr: "status 401", RenderErr: "ignored"}, false, "decision API: status 401", "could not compute the probe's keys"},
	} {
		tc.f.Probe, tc.f.Via, tc.f.Tokens = "chat", "chat/completions render", 50
		if tc.f.PickerErr == "" {
			tc.f.Endpoint = "http://e"
		}
		c := JudgeTokenParity(tc.f)
		if c.Name != "probe chat tokens" || c.Endpoint != tc.f.Endpoint {
			t.Errorf("%s: %+v", tc.name, c)
		}
		judged(t, tc.name, c, tc.ok, tc.detail, tc.cause)
	}
}

func TestProbeTarget(t *testing.T) {
	fleet := []debugapi.Endpoint{healthy(1, "a"), healthy(2, "b")}
	if e, err := ProbeTarget(fleet, fleet[1].Endpoint, "b"); err != nil || e != fleet[1] {
		t.Fatalf("%+v %v", e, err)
	}
	for _, tc := range []struct{ url, model, want string }{
		{"http://10.0.0.9:8000", "a", `the picker sent the probe to "http://10.0.0.9:8000", which its /debug/endpoints does not list`},
		{"", "a", `the picker sent the probe to "", which`},
		{fleet[1].Endpoint, "a", "the picker sent a a probe to http://10.0.0.2:8000, which serves b"},
	} {
		if _, err := ProbeTarget(fleet, tc.url, tc.model); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s for %s: %v, want %q", tc.url, tc.model, err, tc.want)
		}
	}
	if _, ok := FindEndpoint(nil, "http://x"); ok {
		t.Fatal("found in an empty fleet")
	}
}

func TestJudgeGossip(t *testing.T) {
	const e = "http://10.0.0.1:8000"
	for _, tc := range []struct {
		name string
		f    SidecarFacts
		ok   bool
	}{
		{"encrypted", SidecarFacts{Endpoint: e, DebugURL: "http://10.0.0.1:8090"}, true},
		{"insecure", SidecarFacts{Endpoint: e, DebugURL: "http://10.0.0.1:8090", GossipInsecure: true}, false},
		{"not read", SidecarFacts{Endpoint: e, DebugURL: "http://10.0.0.1:8090", Err: "refused", GossipInsecure: true}, true},
	} {
		c := JudgeGossip(tc.f)
		if c.Name != "gossip encrypted" || c.Endpoint != e || c.OK != tc.ok || !tc.ok && !strings.Contains(c.Cause, "--gossip-key-file") {
			t.Errorf("%s: %+v", tc.name, c)
		}
	}
}
