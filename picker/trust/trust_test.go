package trust

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// resolver is a fixed name table standing in for the picker's lookups.
var resolver = map[string][]netip.Addr{
	"node-a":        {netip.MustParseAddr("10.0.0.5")},
	"node-a-alias":  {netip.MustParseAddr("10.0.0.5")},
	"node-b":        {netip.MustParseAddr("10.0.0.9")},
	"dual":          {netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")},
	"half-allowed":  {netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("192.168.7.1")},
	"mapped":        {netip.MustParseAddr("::ffff:10.0.0.5")},
	"loop":          {netip.MustParseAddr("127.0.0.1")},
	"engines.local": {netip.MustParseAddr("192.168.7.20"), netip.MustParseAddr("192.168.7.21")},
}

// host is what the picker hands Judge for a host string: a literal, or
// the name looked up in the table (a name missing from it does not
// resolve).
func host(s string) Host {
	if h, ok := Literal(s); ok {
		return h
	}
	addrs, ok := resolver[NormName(s)]
	if !ok {
		return Resolved(s, nil, errors.New("no such host"))
	}
	return Resolved(s, addrs, nil)
}

// judge runs the whole decision as the picker does: parse both sides,
// classify or resolve their hosts, judge.
func judge(t *testing.T, allow []string, sidecarAddr, endpointURL string) Verdict {
	t.Helper()
	prefixes, err := ParseAllow(allow)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := SidecarHost(sidecarAddr)
	if err != nil {
		return Malformed(err)
	}
	eh, err := EndpointHost(endpointURL)
	if err != nil {
		return Malformed(err)
	}
	return Policy{Allow: prefixes}.Judge(host(sh), host(eh))
}

func TestJudge(t *testing.T) {
	for _, c := range []struct {
		name     string
		allow    []string
		sidecar  string
		endpoint string
		want     string // BySameHost, ByAllowed, or the refusal reason
	}{
		// One host, the defaults: everything on loopback.
		{"loopback", nil, "127.0.0.1:9090", "http://127.0.0.1:8000", BySameHost},
		{"loopback, ports ignored", nil, "127.0.0.1:9091", "http://127.0.0.1:8001/v1", BySameHost},
		{"loopback, another loopback address", nil, "127.0.0.1:9090", "http://127.0.0.2:8000", BySameHost},
		{"loopback, v6 sidecar v4 engine", nil, "[::1]:9090", "http://127.0.0.1:8000", BySameHost},
		{"localhost sidecar, 127.0.0.1 engine", nil, "localhost:9090", "http://127.0.0.1:8000", BySameHost},
		{"127.0.0.1 sidecar, localhost engine", nil, "127.0.0.1:9090", "http://localhost:8000", BySameHost},
		{"localhost, any case", nil, "LOCALHOST:9090", "http://localhost.:8000", BySameHost},
		{"name under .localhost", nil, "127.0.0.1:9090", "http://engine.localhost:8000", BySameHost},
		{"unspecified sidecar address is this host", nil, "0.0.0.0:9090", "http://127.0.0.1:8000", BySameHost},
		{"unix socket sidecar is this host", nil, "unix:///run/kvroute.sock", "http://127.0.0.1:8000", BySameHost},
		{"loopback name resolving to loopback", nil, "127.0.0.1:9090", "http://loop:8000", BySameHost},

		// Kubernetes: the sidecar beside its engine, both at the pod IP.
		{"pod IP", nil, "10.0.0.5:9090", "http://10.0.0.5:8000", BySameHost},
		{"pod IP, rank 1", nil, "10.0.0.5:9090", "http://10.0.0.5:8001", BySameHost},
		{"v6 pod IP", nil, "[fd00::5]:9090", "http://[fd00::5]:8000", BySameHost},
		{"v6 written two ways", nil, "[fd00:0::5]:9090", "http://[FD00::0005]:8000", BySameHost},
		{"mapped sidecar, v4 engine", nil, "[::ffff:10.0.0.5]:9090", "http://10.0.0.5:8000", BySameHost},
		{"v4 sidecar, mapped engine", nil, "10.0.0.5:9090", "http://[::ffff:10.0.0.5]:8000", BySameHost},
		{"zone dropped", nil, "[fe80::1%eth0]:9090", "http://[fe80::1%25eth1]:8000", BySameHost},
		{"gRPC dns target", nil, "dns:///10.0.0.5:9090", "http://10.0.0.5:8000", BySameHost},
		{"gRPC dns target with a server", nil, "dns://10.96.0.10/node-a:9090", "http://10.0.0.5:8000", BySameHost},
		{"gRPC passthrough target", nil, "passthrough:///10.0.0.5:9090", "https://10.0.0.5:8443", BySameHost},
		{"sidecar without a port", nil, "10.0.0.5", "http://10.0.0.5:8000", BySameHost},

		// Another host.
		{"another IP", nil, "10.0.0.5:9090", "http://10.0.0.9:8000", ReasonRemote},
		{"another v6", nil, "[fd00::5]:9090", "http://[fd00::9]:8000", ReasonRemote},
		{"v4 sidecar, v6 engine", nil, "10.0.0.5:9090", "http://[fd00::5]:8000", ReasonRemote},
		{"remote sidecar, loopback engine", nil, "10.0.0.5:9090", "http://127.0.0.1:8000", ReasonRemote},
		{"remote sidecar, localhost engine", nil, "10.0.0.5:9090", "http://localhost:8000", ReasonRemote},
		{"loopback sidecar, remote engine", nil, "127.0.0.1:9090", "http://10.0.0.9:8000", ReasonRemote},
		{"loopback sidecar, the host's own address", nil, "127.0.0.1:9090", "http://192.0.2.2:8000", ReasonRemote},
		{"remote sidecar, mapped loopback engine", nil, "10.0.0.5:9090", "http://[::ffff:127.0.0.1]:8000", ReasonRemote},

		// Names.
		{"one name", nil, "node-a:9090", "http://node-a:8000", BySameHost},
		{"one name, any case", nil, "Node-A.:9090", "http://node-a:8000", BySameHost},
		{"one unresolvable name", nil, "gone:9090", "http://GONE:8000", BySameHost},
		{"name and its IP", nil, "node-a:9090", "http://10.0.0.5:8000", BySameHost},
		{"IP and its name", nil, "10.0.0.5:9090", "http://node-a:8000", BySameHost},
		{"two names, one address", nil, "node-a:9090", "http://node-a-alias:8000", BySameHost},
		{"mapped name", nil, "10.0.0.5:9090", "http://mapped:8000", BySameHost},
		{"two names, two hosts", nil, "node-a:9090", "http://node-b:8000", ReasonRemote},
		{"engine name resolving elsewhere too", nil, "10.0.0.5:9090", "http://dual:8000", ReasonRemote},
		{"sidecar name with both addresses", nil, "dual:9090", "http://10.0.0.5:8000", BySameHost},
		{"engine name that does not resolve", nil, "10.0.0.5:9090", "http://gone:8000", ReasonUnresolved},
		{"sidecar name that does not resolve", nil, "gone:9090", "http://10.0.0.9:8000", ReasonUnresolved},

		// Allowed networks.
		{"allowed v4", []string{"10.0.0.0/24"}, "10.1.0.5:9090", "http://10.0.0.9:8000", ByAllowed},
		{"allowed, one of several", []string{"192.168.0.0/16", "10.0.0.0/24"}, "10.1.0.5:9090", "http://10.0.0.9:8000", ByAllowed},
		{"allowed single address", []string{"10.0.0.9"}, "10.1.0.5:9090", "http://10.0.0.9:8000", ByAllowed},
		{"allowed, other address refused", []string{"10.0.0.9/32"}, "10.1.0.5:9090", "http://10.0.0.10:8000", ReasonRemote},
		{"allowed v6", []string{"fd00::/8"}, "10.1.0.5:9090", "http://[fd12::9]:8000", ByAllowed},
		{"allowed mapped prefix covers v4", []string{"::ffff:10.0.0.0/120"}, "10.1.0.5:9090", "http://10.0.0.9:8000", ByAllowed},
		{"allowed v4 covers mapped", []string{"10.0.0.0/24"}, "10.1.0.5:9090", "http://[::ffff:10.0.0.9]:8000", ByAllowed},
		{"allowed unmasked prefix", []string{"10.0.0.77/24"}, "10.1.0.5:9090", "http://10.0.0.9:8000", ByAllowed},
		{"v4 network does not cover v6", []string{"10.0.0.0/8"}, "10.1.0.5:9090", "http://[fd00::9]:8000", ReasonRemote},
		{"allowed loopback from a remote sidecar", []string{"127.0.0.0/8"}, "10.0.0.5:9090", "http://127.0.0.1:8000", ByAllowed},
		{"every network", []string{"0.0.0.0/0", "::/0"}, "10.0.0.5:9090", "http://[fd00::9]:8000", ByAllowed},
		{"allowed name, every address", []string{"192.168.7.0/24"}, "10.0.0.5:9090", "http://engines.local:8000", ByAllowed},
		{"name half here, half allowed", []string{"192.168.7.0/24"}, "10.0.0.5:9090", "http://half-allowed:8000", ByAllowed},
		{"name half here, half not", nil, "10.0.0.5:9090", "http://half-allowed:8000", ReasonRemote},
		{"unresolved name is not allowed", []string{"0.0.0.0/0"}, "10.0.0.5:9090", "http://gone:8000", ReasonUnresolved},
		{"allowed despite an unresolved sidecar", []string{"10.0.0.0/24"}, "gone:9090", "http://10.0.0.9:8000", ByAllowed},

		// Malformed.
		{"no scheme", nil, "127.0.0.1:9090", "127.0.0.1:8000", ReasonMalformed},
		{"other scheme", nil, "127.0.0.1:9090", "tcp://127.0.0.1:8000", ReasonMalformed},
		{"no host", nil, "127.0.0.1:9090", "http://:8000", ReasonMalformed},
		{"empty", nil, "127.0.0.1:9090", "", ReasonMalformed},
		{"not a URL", nil, "127.0.0.1:9090", "http://[::1:8000", ReasonMalformed},
		{"unspecified v4 endpoint", nil, "127.0.0.1:9090", "http://0.0.0.0:8000", ReasonMalformed},
		{"unspecified v6 endpoint", []string{"::/0"}, "[::]:9090", "http://[::]:8000", ReasonMalformed},
		{"sidecar target of another scheme", nil, "xds:///sidecars", "http://127.0.0.1:8000", ReasonMalformed},
		{"sidecar address unbalanced", nil, "[::1:9090", "http://127.0.0.1:8000", ReasonMalformed},
		{"sidecar address with colons", nil, "a:b:c", "http://127.0.0.1:8000", ReasonMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := judge(t, c.allow, c.sidecar, c.endpoint)
			got := v.Reason
			if v.OK {
				got = v.By
			}
			if got != c.want || v.OK == (v.Reason != "") {
				t.Fatalf("sidecar %s, endpoint %s, allow %v: %+v; want %s", c.sidecar, c.endpoint, c.allow, v, c.want)
			}
			if !v.OK && v.Detail == "" {
				t.Fatal("a refusal without a detail")
			}
		})
	}
}

// The refusal's sentence names both hosts, and says what a loopback
// endpoint means.
func TestDetail(t *testing.T) {
	v := judge(t, nil, "10.0.0.5:9090", "http://127.0.0.1:8000")
	for _, want := range []string{"127.0.0.1", "10.0.0.5", "picker's own host", "--engine-url", "no --allow-remote-endpoints"} {
		if !strings.Contains(v.Detail, want) {
			t.Errorf("detail %q does not say %q", v.Detail, want)
		}
	}
	v = judge(t, []string{"192.168.0.0/16"}, "node-a:9090", "http://node-b:8000")
	for _, want := range []string{"node-b (10.0.0.9)", "node-a (10.0.0.5)", "nor in an --allow-remote-endpoints network"} {
		if !strings.Contains(v.Detail, want) {
			t.Errorf("detail %q does not say %q", v.Detail, want)
		}
	}
	if v := judge(t, nil, "10.0.0.5:9090", "http://gone:8000"); !strings.Contains(v.Detail, "gone") || !strings.Contains(v.Detail, "no such host") {
		t.Errorf("unresolved detail %q", v.Detail)
	}
}

func TestParseAllow(t *testing.T) {
	got, err := ParseAllow([]string{" 10.0.0.0/8", "10.1.2.3/16", "fd00::/8", "192.0.2.7", "::1", "::ffff:10.0.0.0/104", "::ffff:0:0/96", "::ffff:0:0/64"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0/8", "10.1.0.0/16", "fd00::/8", "192.0.2.7/32", "::1/128", "10.0.0.0/8", "0.0.0.0/0", "::/64"}
	if len(got) != len(want) {
		t.Fatalf("%v", got)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("entry %d: %s, want %s", i, got[i], want[i])
		}
	}
	if got, err := ParseAllow(nil); err != nil || got != nil {
		t.Fatalf("none: %v, %v", got, err)
	}
	for _, bad := range []string{"", " ", "10.0.0.0/33", "10.0.0.0/", "fd00::/129", "10.0.0.300", "example.com", "10.0.0.0/8/8", "fe80::1%eth0", "10.0.0.0-10.0.0.9"} {
		_, err := ParseAllow([]string{"10.0.0.0/8", bad})
		if err == nil {
			t.Errorf("%q taken", bad)
			continue
		}
		if s := strings.TrimSpace(bad); s != "" && !strings.Contains(err.Error(), s) {
			t.Errorf("%q: the error %q does not name it", bad, err)
		}
	}
	// Every bad entry is named, not only the first.
	if _, err := ParseAllow([]string{"x", "10.0.0.0/8", "y"}); err == nil || !strings.Contains(err.Error(), `"x"`) || !strings.Contains(err.Error(), `"y"`) {
		t.Fatalf("two bad entries: %v", err)
	}
}

func TestHostString(t *testing.T) {
	if s := host("10.0.0.5").String(); s != "10.0.0.5" {
		t.Fatal(s)
	}
	if s := host("Node-A").String(); s != "node-a" {
		t.Fatal(s)
	}
	if s := host("node-a").describe(); s != "node-a (10.0.0.5)" {
		t.Fatal(s)
	}
}
