package picker_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/extproc"
	"github.com/kvroute/kvroute/picker/tenant"
	"github.com/kvroute/kvroute/test/enginesim"
)

// applied is a request body message as the gateway sends it on after the
// picker's answer: replaced by a body mutation, cleared, or unchanged.
func applied(chunk []byte, common *extprocv3.CommonResponse) []byte {
	switch m := common.GetBodyMutation().GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		return m.Body
	case *extprocv3.BodyMutation_ClearBody:
		if m.ClearBody {
			return nil
		}
	}
	return chunk
}

// contentLength is the content-length a routing answer sets ("" none).
func contentLength(common *extprocv3.CommonResponse) string {
	return setHeaders(common)["content-length"]
}

// upstream drives a request through the picker in the gateway's body mode
// (STREAMED waiting for the headers' answer when waiting is set) and
// returns what the gateway sends upstream: the destination, the body with
// the picker's answers applied as Envoy applies them, and the
// content-length the picker set; or the immediate response instead.
func (g *gateway) upstream(body []byte, waiting bool) (route string, sent []byte, cl string, refused *extprocv3.ProcessingResponse) {
	t := g.t
	t.Helper()
	h := g.requestHeaders(false, nil)
	if waiting {
		h.ProtocolConfig.SendBodyWithoutWaitingForHeaderResponse = false
	}
	g.send(h)
	buffered := func() (string, []byte, string, *extprocv3.ProcessingResponse) {
		g.send(requestBody(body, true))
		m := g.recv()
		if m.GetImmediateResponse() != nil {
			return "", nil, "", m
		}
		common := m.GetRequestBody().GetResponse()
		g.set = setHeaders(common)
		return routeOf(t, m, common), applied(body, common), contentLength(common), nil
	}
	switch {
	case g.mode == filterv3.ProcessingMode_BUFFERED || g.mode == filterv3.ProcessingMode_BUFFERED_PARTIAL:
		if m := g.recv(); m.GetRequestHeaders() == nil {
			t.Fatalf("buffered: the headers' answer %v", m)
		}
		return buffered()
	case waiting:
		if m := g.recv(); m.GetModeOverride().GetRequestBodyMode() != filterv3.ProcessingMode_BUFFERED {
			t.Fatalf("streamed, waiting: want a mode override to BUFFERED, got %v", m)
		}
		return buffered()
	}
	parts := chunks(body, 3)
	for i, c := range parts {
		g.send(requestBody(c, i == len(parts)-1))
	}
	m := g.recv()
	if m.GetImmediateResponse() != nil {
		return "", nil, "", m
	}
	common := m.GetRequestHeaders().GetResponse()
	if common == nil {
		t.Fatalf("want the headers' answer first, got %v", m)
	}
	route, cl, g.set = routeOf(t, m, common), contentLength(common), setHeaders(common)
	if g.mode == filterv3.ProcessingMode_STREAMED {
		for _, c := range parts {
			b := g.recv().GetRequestBody()
			if b == nil {
				t.Fatal("streamed: want a chunk's answer")
			}
			sent = append(sent, applied(c, b.GetResponse())...)
		}
		return route, sent, cl, nil
	}
	for { // FULL_DUPLEX_STREAMED: the body goes on only as streamed back
		b := g.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if b == nil {
			t.Fatal("full duplex: want the body streamed back")
		}
		sent = append(sent, b.GetBody()...)
		if b.GetEndOfStream() {
			return route, sent, cl, nil
		}
	}
}

// sentOn sends body through the gateway g (upstream), ends the exchange,
// and returns the body sent on, decoded and as bytes, with its
// content-length; a refusal or a body that is not JSON fails the test.
func (g *gateway) sentOn(t *testing.T, body []byte, waiting bool) (map[string]any, []byte, string) {
	t.Helper()
	_, sent, cl, refused := g.upstream(body, waiting)
	if refused != nil {
		t.Fatalf("refused: %v", refused)
	}
	g.end()
	var got map[string]any
	if err := json.Unmarshal(sent, &got); err != nil {
		t.Fatalf("the body sent on is not JSON: %v: %s", err, sent)
	}
	return got, sent, cl
}

// eppBodyModes are the endpoint picker's body modes as a gateway uses
// them: STREAMED also with the gateway waiting for the picker's answer
// to each chunk.
var eppBodyModes = []struct {
	name    string
	mode    filterv3.ProcessingMode_BodySendMode
	waiting bool
}{
	{"FULL_DUPLEX_STREAMED", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false},
	{"BUFFERED", filterv3.ProcessingMode_BUFFERED, false},
	{"BUFFERED_PARTIAL", filterv3.ProcessingMode_BUFFERED_PARTIAL, false},
	{"STREAMED", filterv3.ProcessingMode_STREAMED, false},
	{"STREAMED_waiting", filterv3.ProcessingMode_STREAMED, true},
}

// TestEPPTenantSalts: with --tenant-header, the endpoint picker sets the
// tenant's derived cache_salt in the body it sends on, replacing the
// client's (another tenant's derived salt even), in every body mode —
// FULL_DUPLEX_STREAMED, BUFFERED, BUFFERED_PARTIAL, STREAMED sent without
// waiting and STREAMED turned BUFFERED — with the content-length set to
// the rewritten body's; the decision is keyed by that salt (its prefix
// hash is the decision API's for the tenant, not the client's salt's).
// Without the header the body goes on as sent.
func TestEPPTenantSalts(t *testing.T) {
	const key = "0123456789abcdef0123456789abcdef"
	f := tenantFleet(t, false, key)
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	s, _ := tenant.NewSalter([]byte(key))
	prompt := strings.Repeat("Tell me about tenants. ", 30)
	_, acme, _ := f.pick(t, chatBody("client-chosen", prompt), as("acme"), "")
	_, client, _ := f.pick(t, chatBody("client-chosen", prompt), nil, "")
	if acme.PrefixHash == "" || acme.PrefixHash == client.PrefixHash {
		t.Fatalf("prefix hashes: acme %q, the client's salt %q", acme.PrefixHash, client.PrefixHash)
	}
	for _, tc := range eppBodyModes {
		t.Run(tc.name, func(t *testing.T) {
			for _, clientSalt := range []string{"client-chosen", s.Salt("globex")} {
				g := openGateway(t, conn, tc.mode)
				g.extra = append(g.extra, header("x-tenant", "acme"))
				got, sent, cl := g.sentOn(t, []byte(chatBody(clientSalt, prompt)), tc.waiting)
				if got["cache_salt"] != s.Salt("acme") || got["model"] != "Qwen/Qwen3-0.6B" || got["messages"] == nil {
					t.Fatalf("client salt %q: the body sent on has cache_salt %v (want acme's derived salt), model %v", clientSalt, got["cache_salt"], got["model"])
				}
				if strings.Count(string(sent), `"cache_salt"`) != 1 {
					t.Fatalf("the body sent on carries cache_salt more than once: %s", sent)
				}
				if cl != strconv.Itoa(len(sent)) {
					t.Fatalf("content-length %q for a %d-byte body sent on", cl, len(sent))
				}
				if g.set["x-kvroute-prefix-hash"] != acme.PrefixHash {
					t.Fatalf("prefix hash %q: want acme's %q (the client's salt gives %q)", g.set["x-kvroute-prefix-hash"], acme.PrefixHash, client.PrefixHash)
				}
			}
			// No tenant: the client's salt stands, the body unchanged.
			g := openGateway(t, conn, tc.mode)
			body := chatBody("client-chosen", prompt)
			_, sent, _, refused := g.upstream([]byte(body), tc.waiting)
			if refused != nil {
				t.Fatalf("refused: %v", refused)
			}
			g.end()
			if string(sent) != body || g.set["x-kvroute-prefix-hash"] != client.PrefixHash {
				t.Fatalf("without the tenant header: body changed %v, prefix hash %q (want the client's salt's %q)", string(sent) != body, g.set["x-kvroute-prefix-hash"], client.PrefixHash)
			}
		})
	}
}

// TestEPPTenantRequired: with --require-tenant the endpoint picker
// refuses a request without the tenant header (401 tenant_required) and
// one naming it badly (400 invalid_tenant), as immediate responses.
func TestEPPTenantRequired(t *testing.T) {
	f := tenantFleet(t, true, "0123456789abcdef0123456789abcdef")
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	for _, tc := range []struct {
		tenant []string
		status int
		code   string
	}{{nil, http.StatusUnauthorized, "tenant_required"}, {[]string{" acme"}, http.StatusBadRequest, "invalid_tenant"}} {
		g := openGateway(t, conn, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED)
		for _, v := range tc.tenant {
			g.extra = append(g.extra, header("x-tenant", v))
		}
		_, _, _, refused := g.upstream([]byte(chatBody("", "hello")), false)
		if refused == nil {
			t.Fatalf("tenant %q: routed, want %d %s", tc.tenant, tc.status, tc.code)
		}
		if st, code := immediate(t, refused); st != tc.status || code != tc.code {
			t.Fatalf("tenant %q: %d %s, want %d %s", tc.tenant, st, code, tc.status, tc.code)
		}
	}
}

// TestEPPEnginePriority: with --engine-priority the endpoint picker sets
// the decision's priority in the body the gateway sends on, in every body
// mode, replacing the client's, with the content-length to match; without
// it the body goes as sent.
func TestEPPEnginePriority(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.EnginePriority = true
	f := startFleetWith(t, 1, cfg, "", func(c *enginesim.Config) { c.SchedulingPolicy = "priority" })
	conn := serveEPP(t, f.router, extproc.DefaultConfig())
	prompt := strings.Repeat("Tell me about priorities. ", 30)
	body := strings.Replace(chatBody("s1", prompt), `{`, `{"priority":7,`, 1)
	for _, tc := range eppBodyModes {
		t.Run(tc.name, func(t *testing.T) {
			g := openGateway(t, conn, tc.mode)
			g.extra = append(g.extra, header("x-kvroute-tenant", "acme"), header("x-kvroute-priority", "2"))
			got, sent, cl := g.sentOn(t, []byte(body), tc.waiting)
			// Band 2, a tenant alone (within its share): −4.
			if got["priority"] != float64(-4) || strings.Count(string(sent), `"priority"`) != 1 || got["cache_salt"] != "s1" || got["messages"] == nil {
				t.Fatalf("the body sent on: %s", sent)
			}
			if cl != strconv.Itoa(len(sent)) {
				t.Fatalf("content-length %q for a %d-byte body sent on", cl, len(sent))
			}
		})
	}
	off := startFleet(t, 1, picker.DefaultConfig(), "")
	g := openGateway(t, serveEPP(t, off.router, extproc.DefaultConfig()), filterv3.ProcessingMode_BUFFERED)
	_, sent, _, refused := g.upstream([]byte(body), false)
	if refused != nil {
		t.Fatal(refused)
	}
	g.end()
	if string(sent) != body {
		t.Fatalf("without --engine-priority the body changed: %s", sent)
	}
}
