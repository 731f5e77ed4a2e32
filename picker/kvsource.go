package picker

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"strconv"

	"github.com/valyala/fastjson"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
)

// The wire names of a KV source (kv-transfer.md §2.2, §3).
const (
	// kvParamsKey is the body member vLLM reads its KV connector's
	// directives from; remote_kv_source (kv_request_id, remote_host,
	// remote_port) makes its P2P tier pull the prompt's prefix out of that
	// peer's CPU tier.
	kvParamsKey = "kv_transfer_params"
	// KVSourceHeader is llm-d's routing-sidecar header: the endpoint picker
	// sets it to the source's host:port, and the sidecar beside the engine
	// turns it into kv_transfer_params.remote_kv_source. A client's is
	// never passed on.
	KVSourceHeader = "x-kv-cache-source-host-port"
	// KVSourceAnswerHeader names the source (host:port) on a proxied
	// answer, beside the other x-kvroute-* headers (--response-headers
	// all: it is a pod's address).
	KVSourceAnswerHeader = "X-Kvroute-Kv-Source"
)

// Why a decision's source is not carried to the wire: the reasons of
// kvroute_picker_kv_sources_dropped_total.
const (
	sourceIsComputing = "computing"    // the chosen endpoint itself
	sourceNotInGroup  = "not_in_group" // not an endpoint of the request's identity group as the decision saw it
	sourceNoAddress   = "no_address"   // it advertises no KV source address (its engine runs no P2P tier)
)

// sourceDropReasons are kvroute_picker_kv_sources_dropped_total's reasons.
var sourceDropReasons = []string{sourceIsComputing, sourceNotInGroup, sourceNoAddress}

// kvSource is a decision's source as the wire carries it.
type kvSource struct {
	url    string // the source endpoint's URL (the metrics' engine label)
	addr   string // its P2P side channel, host:port, as its sidecar advertised it
	tokens int    // the prompt tokens the pull is expected to bring
}

// sourceOf resolves d's source (an endpoint URL) against group, the
// endpoints the decision saw (the request's identity group): the source's
// advertised KV source address, or, when none is to be named, why not
// ("" when d names none). A source is never the chosen endpoint, always
// one of group, and only one that advertises an address (fleetview took
// it on its engine's own host). The decision guarantees the first two;
// they are checked again here, since an engine told to pull from the
// wrong place would stall or pull another tenant's blocks.
func sourceOf(d *decide.Decision, group []*fleet.Endpoint) (kvSource, string) {
	if d.Source == "" || !d.OK() {
		return kvSource{}, ""
	}
	if d.Source == d.Endpoint {
		return kvSource{}, sourceIsComputing
	}
	for _, e := range group {
		if e.URL == d.Source {
			if e.Info.KVSource == "" {
				return kvSource{}, sourceNoAddress
			}
			return kvSource{url: e.URL, addr: e.Info.KVSource, tokens: max(d.SourceTokens, 0)}, ""
		}
	}
	return kvSource{}, sourceNotInGroup
}

// dropKVParams returns body, a JSON object, without any top-level
// kv_transfer_params (every copy, however its key is escaped: an engine
// may read the last), and whether it had one. A body that is not a JSON
// object comes back as it is: the intake refuses it.
func dropKVParams(body []byte) ([]byte, bool) {
	// A member named kv_transfer_params is spelled so, or with \u escapes.
	if !bytes.Contains(body, []byte(kvParamsKey)) && !bytes.Contains(body, []byte(`\u`)) {
		return body, false
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil {
		return body, false
	}
	o, err := v.Object()
	if err != nil || o.Get(kvParamsKey) == nil {
		return body, false
	}
	for o.Get(kvParamsKey) != nil {
		o.Del(kvParamsKey)
	}
	return v.MarshalTo(make([]byte, 0, len(body))), true
}

// withKVSource returns body, a JSON object holding no kv_transfer_params
// (dropKVParams ran), with kv_transfer_params set to
// {"remote_kv_source": {"kv_request_id": id, "remote_host": host,
// "remote_port": port}} for addr (host:port), every other member kept as
// sent: the member is spliced in before the closing brace.
func withKVSource(body []byte, addr, id string) ([]byte, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return nil, errors.New("the KV source's port is not a port")
	}
	return spliceMember(body, 160, func(out []byte) []byte {
		out = append(out, `"kv_transfer_params":{"remote_kv_source":{"kv_request_id":`...)
		out = appendJSONString(out, id)
		out = append(out, `,"remote_host":`...)
		out = appendJSONString(out, host)
		out = append(out, `,"remote_port":`...)
		out = strconv.AppendInt(out, int64(n), 10)
		return append(out, "}}"...)
	})
}

// spliceMember returns body, a JSON object, with one member appended
// before its closing brace (a comma before it unless the object is empty),
// every other byte kept as sent: member appends the member's bytes ("key":
// value) to out. grow is the member's expected size.
func spliceMember(body []byte, grow int, member func(out []byte) []byte) ([]byte, error) {
	end := len(bytes.TrimRight(body, " \t\r\n")) - 1
	if end < 1 || body[end] != '}' {
		return nil, errors.New("the body is not a JSON object")
	}
	prev := len(bytes.TrimRight(body[:end], " \t\r\n")) - 1 // a member's last byte, or the opening brace
	if prev < 0 {
		return nil, errors.New("the body is not a JSON object")
	}
	out := make([]byte, 0, len(body)+grow)
	out = append(out, body[:end]...)
	if body[prev] != '{' {
		out = append(out, ',')
	}
	return append(member(out), body[end:]...), nil
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	var a fastjson.Arena
	return a.NewString(s).MarshalTo(dst)
}

// newKVRequestID is a fresh kv_request_id for one transfer: a random
// UUID (version 4), as llm-d's sidecar makes one.
func newKVRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// sourcedBody is body as forwarded to p's endpoint: with
// kv_transfer_params.remote_kv_source when the decision named a source
// (the engine pulls the prefix from it; a fresh transfer id per attempt),
// as received otherwise.
func (r *Router) sourcedBody(p *Pick, body []byte) []byte {
	if p.source.addr == "" {
		return body
	}
	b, err := withKVSource(body, p.source.addr, newKVRequestID())
	if err != nil { // the intake took the body as a JSON object: not expected
		r.log.Debug("KV source not set on the forwarded body", zap.String("endpoint", p.Endpoint), zap.Error(err))
		return body
	}
	return b
}

// dropClientKVParams removes the kv_transfer_params a client sent on a
// proxied body: the router alone decides where a request's KV comes from.
// Counted, and logged at debug (without the body).
func (r *Router) dropClientKVParams(body []byte, requestID string) []byte {
	out, dropped := dropKVParams(body)
	if dropped {
		r.m.clientKVDropped.Inc()
		r.log.Debug("the client's kv_transfer_params dropped", zap.String("request_id", requestID))
	}
	return out
}
