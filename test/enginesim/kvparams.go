package enginesim

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strconv"

	"go.uber.org/zap"
)

// kvSource is a request's remote_kv_source: the peer to pull its prefix
// from (host:port, the peer's P2P side channel) and the consumer-side
// kv_request_id. The zero value is none.
type kvSource struct {
	peer        string
	kvRequestID string
}

// Why a request's kv_transfer_params (or part of it) was ignored: the
// values of kvroute_engine_kv_transfer_params_ignored_total's reason.
const (
	// kvIgnoredMalformed: remote_kv_source (or the whole) is not what the
	// connector reads: not an object, an empty or over-long
	// kv_request_id or remote_host, a remote_port outside 1..65535.
	kvIgnoredMalformed = "malformed"
	// kvIgnoredNoP2P: a well-formed remote_kv_source on an engine without
	// the P2P tier.
	kvIgnoredNoP2P = "no_p2p_tier"
	// kvIgnoredNotModelled: the P/D roles (remote_prefiller, which also
	// suppresses remote_kv_source as in vLLM, and remote_decoder).
	kvIgnoredNotModelled = "not_modelled"
	// kvIgnoredLegacy: the keys older sidecars sent (p2p, prefill,
	// decode), which current engines ignore silently.
	kvIgnoredLegacy = "legacy_key"
	// kvIgnoredSelf: the source is this rank's own side channel.
	kvIgnoredSelf = "self"
)

var kvIgnoredReasons = []string{kvIgnoredMalformed, kvIgnoredNoP2P, kvIgnoredNotModelled, kvIgnoredLegacy, kvIgnoredSelf}

// Bounds on what a request's kv_transfer_params may carry before it is
// ignored as malformed.
const (
	maxKVTransferParams = 64 << 10
	maxKVRequestID      = 256
	maxRemoteHost       = 253
)

// checkKVTransferParams is vLLM's request validation of the field
// (dict[str, Any] | None): absent or null is none, an object is taken,
// anything else is a 400.
func checkKVTransferParams(raw json.RawMessage) error {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" || t[0] == '{' {
		return nil
	}
	return &apiError{status: http.StatusBadRequest, param: "kv_transfer_params",
		msg: "kv_transfer_params: Input should be a valid dictionary"}
}

// kvSourceOf reads a request's remote_kv_source as vLLM's P2P tier reads
// it (manager.py _parse_source): a present remote_prefiller wins (P/D, not
// modelled), else remote_kv_source with kv_request_id, remote_host and
// remote_port. What the connector would not use is ignored, counted and
// logged at debug, never an error: the request computes locally.
func (e *Engine) kvSourceOf(raw json.RawMessage) kvSource {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" {
		return kvSource{}
	}
	var params map[string]json.RawMessage
	if len(t) > maxKVTransferParams || json.Unmarshal(t, &params) != nil {
		e.ignoreKVParams(kvIgnoredMalformed, "kv_transfer_params not an object within bounds")
		return kvSource{}
	}
	for _, k := range []string{"p2p", "prefill", "decode"} {
		if _, ok := params[k]; ok {
			e.ignoreKVParams(kvIgnoredLegacy, k)
		}
	}
	if present(params, "remote_decoder") {
		e.ignoreKVParams(kvIgnoredNotModelled, "remote_decoder")
	}
	if present(params, "remote_prefiller") {
		e.ignoreKVParams(kvIgnoredNotModelled, "remote_prefiller")
		return kvSource{}
	}
	if !present(params, "remote_kv_source") {
		return kvSource{}
	}
	src, ok := parseRemoteKVSource(params["remote_kv_source"])
	switch {
	case !ok:
		e.ignoreKVParams(kvIgnoredMalformed, "remote_kv_source")
	case !e.cfg.KVTransfer.P2PEnabled():
		e.ignoreKVParams(kvIgnoredNoP2P, src.peer)
	case e.node != nil && src.peer == e.node.ID():
		e.ignoreKVParams(kvIgnoredSelf, src.peer)
	default:
		return src
	}
	return kvSource{}
}

func present(params map[string]json.RawMessage, key string) bool {
	v, ok := params[key]
	return ok && string(bytes.TrimSpace(v)) != "null"
}

// parseRemoteKVSource checks remote_kv_source's fields.
func parseRemoteKVSource(raw json.RawMessage) (kvSource, bool) {
	var rs struct {
		KVRequestID string          `json:"kv_request_id"`
		RemoteHost  string          `json:"remote_host"`
		RemotePort  json.RawMessage `json:"remote_port"`
	}
	if err := json.Unmarshal(raw, &rs); err != nil {
		return kvSource{}, false
	}
	if rs.KVRequestID == "" || len(rs.KVRequestID) > maxKVRequestID || rs.RemoteHost == "" || len(rs.RemoteHost) > maxRemoteHost {
		return kvSource{}, false
	}
	port, err := wholeNumber(rs.RemotePort, 65535) // vLLM formats host:port, so "5710" works too
	if err != nil || port < 1 {
		return kvSource{}, false
	}
	return kvSource{peer: net.JoinHostPort(rs.RemoteHost, strconv.Itoa(int(port))), kvRequestID: rs.KVRequestID}, true
}

// ignoreKVParams counts and logs (at debug) a kv_transfer_params part
// ignored.
func (e *Engine) ignoreKVParams(reason, what string) {
	e.metrics.kvParamsIgnored.WithLabelValues(reason).Inc()
	e.log.Debug("kv_transfer_params ignored", zap.String("reason", reason), zap.String("what", what))
}
