package trust

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// The reasons an endpoint is refused (Verdict.Reason), as the picker lists
// and counts them.
const (
	// ReasonRemote: the endpoint's host is not the host of the sidecar
	// advertising it, and no allowed network covers it.
	ReasonRemote = "remote_endpoint"
	// ReasonMalformed: the endpoint URL names no host the picker could
	// check (not http or https, no host, an unspecified address).
	ReasonMalformed = "malformed_endpoint"
	// ReasonUnresolved: a name the decision needs (the endpoint's host,
	// or the sidecar's) did not resolve.
	ReasonUnresolved = "unresolved_endpoint"
)

// Reasons are every refusal reason, for metrics that show each from the
// start.
var Reasons = []string{ReasonRemote, ReasonMalformed, ReasonUnresolved}

// How an endpoint was accepted (Verdict.By).
const (
	BySameHost = "same_host" // its host is the sidecar's
	ByAllowed  = "allowed"   // an allowed network covers its host
)

// Policy decides which endpoints the picker takes from a sidecar. The zero
// Policy takes only endpoints on their sidecar's own host.
type Policy struct {
	// Allow are the networks whose endpoints any sidecar may advertise
	// (--allow-remote-endpoints), as ParseAllow returns them.
	Allow []netip.Prefix
}

// ParseAllow parses the entries of --allow-remote-endpoints: each a CIDR
// (10.0.0.0/8, fd00::/8) or one address (a single host). Prefixes are
// masked to their network, and an IPv4-mapped IPv6 prefix of /96 or longer
// becomes the IPv4 prefix it maps (addresses are compared unmapped). An
// empty entry or one that is neither is an error naming it.
func ParseAllow(entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, e := range entries {
		s := strings.TrimSpace(e)
		if s == "" {
			errs = append(errs, errors.New("an empty entry (give CIDRs, comma-separated)"))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				errs = append(errs, fmt.Errorf("%q is not a network: want a CIDR such as 10.0.0.0/8 or fd00::/8, or one address", s))
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, normPrefix(p))
	}
	return out, errors.Join(errs...)
}

// normPrefix masks p and unmaps an IPv4-mapped prefix that covers IPv4
// addresses only.
func normPrefix(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// Host is one side of a decision, the sidecar's or the endpoint's: a
// name as written and the addresses it stands for.
type Host struct {
	// Name is a DNS name, lower-case, without a trailing dot; "" for an
	// IP literal.
	Name string
	// Addrs are the literal's address, or what the name resolved to;
	// normalised (IPv4-mapped addresses unmapped, zones dropped).
	Addrs []netip.Addr
	// Err is why a name has no addresses: its resolution failed.
	Err string
}

// String names h for log lines and listings: the name, or the address.
func (h Host) String() string {
	if h.Name != "" {
		return h.Name
	}
	if len(h.Addrs) == 1 {
		return h.Addrs[0].String()
	}
	return "?"
}

// describe names h with its addresses.
func (h Host) describe() string {
	if h.Name == "" || len(h.Addrs) == 0 {
		return h.String()
	}
	as := make([]string, len(h.Addrs))
	for i, a := range h.Addrs {
		as[i] = a.String()
	}
	return h.Name + " (" + strings.Join(as, ", ") + ")"
}

// EndpointHost returns the host of an endpoint URL as the sidecar
// advertises it (http or https, with a host); the error says what is
// wrong with it.
func EndpointHost(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return "", fmt.Errorf("endpoint URL %q: want http://host:port", raw)
	}
	return u.Hostname(), nil
}

// SidecarHost returns the host of the address the picker dials for a
// sidecar's summary stream: host:port, [v6]:port or a bare host, or a
// gRPC target naming one (dns:///host:port, dns://server/host:port,
// passthrough:///host:port). A unix-socket target is on this host:
// "localhost". Other targets are an error: they name no host to compare.
func SidecarHost(target string) (string, error) {
	t := target
	switch {
	case strings.HasPrefix(t, "unix:"), strings.HasPrefix(t, "unix-abstract:"):
		return "localhost", nil
	case strings.Contains(t, "://"):
		i := strings.Index(t, "://")
		scheme, rest := t[:i], t[i+3:]
		j := strings.Index(rest, "/")
		if (scheme != "dns" && scheme != "passthrough") || j < 0 {
			return "", fmt.Errorf("sidecar address %q: a gRPC target naming no host to compare", target)
		}
		t = rest[j+1:]
	}
	host, ok := splitHost(t)
	if !ok || host == "" {
		return "", fmt.Errorf("sidecar address %q: want host:port", target)
	}
	return host, nil
}

// splitHost returns the host of host:port, [host]:port, a bare host or a
// bare IPv6 address; ports are not checked (they are not compared).
func splitHost(s string) (string, bool) {
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 || (end+1 < len(s) && s[end+1] != ':') {
			return "", false
		}
		return s[1:end], true
	}
	switch strings.Count(s, ":") {
	case 0:
		return s, true
	case 1:
		return s[:strings.Index(s, ":")], true
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return s, true
	}
	return "", false
}

// Literal returns the Host a host needs no lookup for: an IP literal (its
// address, normalised) or localhost and names under .localhost (loopback
// in both families, RFC 6761). ok is false for any other name: the caller
// resolves it (Resolved).
func Literal(host string) (h Host, ok bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		return Host{Addrs: []netip.Addr{norm(a)}}, true
	}
	name := NormName(host)
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return Host{Name: name, Addrs: []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}}, true
	}
	return Host{Name: name}, false
}

// Resolved is the Host of a name that was looked up: the addresses it
// resolved to (normalised), or the lookup's error (err, or no address).
func Resolved(name string, addrs []netip.Addr, err error) Host {
	h := Host{Name: NormName(name)}
	switch {
	case err != nil:
		h.Err = err.Error()
	case len(addrs) == 0:
		h.Err = "no address"
	}
	if err == nil {
		for _, a := range addrs {
			h.Addrs = append(h.Addrs, norm(a))
		}
	}
	return h
}

// NormName is a DNS name as hosts are compared: lower-case, without a
// trailing dot.
func NormName(name string) string { return strings.TrimSuffix(strings.ToLower(name), ".") }

// norm is an address as compared: IPv4-mapped IPv6 unmapped, zone dropped.
func norm(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// Verdict is the decision on one endpoint.
type Verdict struct {
	OK bool
	// By says how an endpoint taken was: BySameHost or ByAllowed.
	By string
	// Reason is why an endpoint was refused: ReasonRemote, ReasonMalformed
	// or ReasonUnresolved.
	Reason string
	// Detail is one sentence on a refusal, for log lines and listings.
	Detail string
}

// Malformed is the verdict on an endpoint URL EndpointHost refused, or a
// sidecar address SidecarHost refused (err says which).
func Malformed(err error) Verdict {
	return Verdict{Reason: ReasonMalformed, Detail: err.Error()}
}

// Judge decides whether the endpoint, advertised by the sidecar, is taken:
//   - when the endpoint's name is the sidecar's (compared as NormName
//     does): the picker reaches both the same way;
//   - else when every address of the endpoint is the sidecar's host's — an
//     address of the sidecar's, or loopback when the sidecar's address is
//     loopback or unspecified (the picker's own host, both) — or lies in
//     an allowed network.
//
// A loopback endpoint of a sidecar dialled at another address is the
// picker's own host, not the sidecar's: refused unless allowed. An
// endpoint whose address is unspecified (0.0.0.0, ::) names no host: it is
// malformed. A name that did not resolve is unresolved, unless allowed
// by name equality.
func (p Policy) Judge(sidecar, endpoint Host) Verdict {
	if endpoint.Name != "" && endpoint.Name == sidecar.Name {
		return Verdict{OK: true, By: BySameHost}
	}
	if endpoint.Err != "" || len(endpoint.Addrs) == 0 {
		return Verdict{Reason: ReasonUnresolved, Detail: fmt.Sprintf("the endpoint's host %s does not resolve: %s", endpoint.Name, orNone(endpoint.Err))}
	}
	for _, a := range endpoint.Addrs {
		if a.IsUnspecified() {
			return Verdict{Reason: ReasonMalformed, Detail: fmt.Sprintf("the endpoint's host %s is an unspecified address: it names no host", endpoint.describe())}
		}
	}
	sidecarLoopback := false
	for _, a := range sidecar.Addrs {
		sidecarLoopback = sidecarLoopback || a.IsLoopback() || a.IsUnspecified()
	}
	same, allowed := true, true
	for _, a := range endpoint.Addrs {
		here := (a.IsLoopback() && sidecarLoopback) || containsAddr(sidecar.Addrs, a)
		covered := p.allows(a)
		same = same && here
		allowed = allowed && (here || covered)
	}
	switch {
	case same:
		return Verdict{OK: true, By: BySameHost}
	case allowed:
		return Verdict{OK: true, By: ByAllowed}
	case sidecar.Err != "" || len(sidecar.Addrs) == 0:
		return Verdict{Reason: ReasonUnresolved, Detail: fmt.Sprintf("the sidecar's host %s does not resolve (%s): its endpoint %s cannot be checked",
			sidecar.Name, orNone(sidecar.Err), endpoint.describe())}
	}
	d := fmt.Sprintf("the endpoint's host %s is not its sidecar's host %s", endpoint.describe(), sidecar.describe())
	if loopbackOnly(endpoint.Addrs) {
		d += " (a loopback endpoint is the picker's own host: give the sidecar's --engine-url its host's address)"
	}
	if len(p.Allow) == 0 {
		d += ", and no --allow-remote-endpoints network is given"
	} else {
		d += ", nor in an --allow-remote-endpoints network"
	}
	return Verdict{Reason: ReasonRemote, Detail: d}
}

// allows reports whether an allowed network holds a.
func (p Policy) allows(a netip.Addr) bool {
	for _, n := range p.Allow {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

func containsAddr(as []netip.Addr, a netip.Addr) bool {
	for _, b := range as {
		if b == a {
			return true
		}
	}
	return false
}

func loopbackOnly(as []netip.Addr) bool {
	for _, a := range as {
		if !a.IsLoopback() {
			return false
		}
	}
	return len(as) > 0
}

func orNone(s string) string {
	if s == "" {
		return "no address"
	}
	return s
}
