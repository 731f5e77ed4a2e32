package sidecar

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/internal/summary"
)

// Config configures a sidecar. Start from DefaultConfig, which holds the
// documented defaults, and change what differs: Validate (Start calls it)
// rejects zero and invalid values and fills nothing in. Only the fields
// that say what their empty value means may be left empty (Replay, Topic,
// GRPCListen, the TLS files, the advertise addresses, Gossip, Model).
type Config struct {
	// EngineURL is rank 0's HTTP base URL; rank r uses port+r.
	// Default http://127.0.0.1:8000.
	EngineURL string
	// KVEvents is rank 0's event endpoint; rank r uses port+r.
	// Default tcp://127.0.0.1:5557.
	KVEvents string
	// Bind makes the SUB bind (the engine's PUB then connects to it);
	// default connect.
	Bind bool
	// Replay is rank 0's replay ROUTER; rank r uses port+r. Empty disables
	// replay. Default tcp://127.0.0.1:5558.
	Replay string
	// Topic is the SUB subscription prefix; "" takes every message.
	Topic string
	// DataParallelSize is the number of ranks (endpoints). Default 1.
	DataParallelSize int
	// P2PPort is rank 0's P2P side-channel port: where peers pull KV out
	// of the engine's CPU tier (vLLM's P2P tier: VLLM_P2P_SIDE_CHANNEL_PORT,
	// 5710 in vLLM, which binds that port plus its data-parallel index).
	// Rank r advertises port+r on its engine URL's host (EndpointInfo
	// kv_source); for a pod holding ranks s.. of a wider data-parallel
	// group, give the base plus s. 0 (the default): the engine runs no P2P
	// tier, and no picker names it as a source.
	P2PPort int
	// GRPCListen serves the summary stream (kvroute.v1.Sidecar) to
	// pickers; empty disables it. Default ":9090".
	GRPCListen string
	// GRPCTLSCert and GRPCTLSKey turn TLS on for the gRPC server.
	GRPCTLSCert, GRPCTLSKey string
	// GRPCClientCA, when set, makes the gRPC server require client
	// certificates (pickers') verified against this PEM CA bundle; it
	// needs GRPCTLSCert. The three files are re-read when they change: new
	// connections take the new material, open streams keep theirs.
	GRPCClientCA string
	// GRPCAdvertise is the gRPC address pickers dial, gossiped in the node
	// metadata; default: the listen address, with the gossip advertise
	// host when listening on every interface.
	GRPCAdvertise string
	// Gossip, when set, makes the sidecar a gossip member advertising its
	// gRPC address, identity group and each endpoint's (epoch, seq).
	Gossip *gossip.Config
	// AdminListen serves /healthz, /readyz, /metrics and /debug/*
	// (host:port; port 0 picks one). Default 127.0.0.1:8090.
	AdminListen string
	// AdminAdvertise is the host:port others (kvroute verify, through the
	// pickers' /debug/endpoints) reach the debug endpoints at; default:
	// the listen address, with the gossip advertise host when listening on
	// every interface.
	AdminAdvertise string
	// Model overrides the canonical model name; default: the first model
	// the engine lists on /v1/models.
	Model string
	// Capacity sizes the summaries (cached blocks per endpoint and tier);
	// default 65536. Fleet-wide: every sidecar of a fleet must agree.
	Capacity int
	// ScrapeInterval is how often the engine's /metrics is read (100–250 ms
	// recommended). Default 200 ms.
	ScrapeInterval time.Duration
	// ScrapeTimeout bounds one scrape: past it the engine is reported down
	// (a hung engine), until a scrape answers again. Default 2 s.
	ScrapeTimeout time.Duration
	// DeltaInterval batches summary bit flips into numbered deltas.
	// Default 10 ms.
	DeltaInterval time.Duration
	// ReplayTimeout bounds one replay exchange. Default 2 s.
	ReplayTimeout time.Duration
	// IdleCheck: after this long without a live message, the sidecar asks
	// the replay ring for anything newer (live messages lost while the SUB
	// reconnects leave no gap to notice). Default 2 s.
	IdleCheck time.Duration
	// StartupTimeout bounds waiting for the engine to answer /v1/models and
	// the render probe. Default 2 minutes.
	StartupTimeout time.Duration
	// StreamWindow is how long the engine may show new blocks in its
	// counters (vLLM's prefix-cache queries − hits) without a live batch
	// arriving before the rank's event stream is reported silent, or
	// replay_only when its batches come only through replay (package
	// sidecar/streamhealth). Keep it longer than IdleCheck, the catch-up
	// period of a one-sided stream. Default 2.5 s: a broken stream shows
	// within about 3 s of the engine's first request.
	StreamWindow time.Duration
	// DrainDelay is how long Drain keeps the summary streams open after it
	// has told the watching pickers the engines are going away (a load
	// report with draining set), so every picker stops sending new
	// requests before the sidecar leaves; it ends early when no picker
	// watches. 0 leaves at once. Default 2 s.
	DrainDelay time.Duration
	// FaultInjection turns on the fault-injection switches, for fault
	// benchmarks (kvroute bench --scenario faults) and tests only: the
	// gossip transport becomes one that can be cut off, and the debug
	// listener serves POST /debug/fault/gossip (see doc.go). Needs Gossip
	// with an exact bind port (BindPorts 1). Default off; never on in a
	// deployment.
	FaultInjection bool
}

// DefaultConfig returns the documented defaults, which fit a vLLM pod.
func DefaultConfig() Config {
	return Config{
		EngineURL:        "http://127.0.0.1:8000",
		KVEvents:         "tcp://127.0.0.1:5557",
		Replay:           "tcp://127.0.0.1:5558",
		DataParallelSize: 1,
		AdminListen:      "127.0.0.1:8090",
		GRPCListen:       ":9090",
		Capacity:         65536,
		ScrapeInterval:   200 * time.Millisecond,
		ScrapeTimeout:    2 * time.Second,
		DeltaInterval:    10 * time.Millisecond,
		ReplayTimeout:    2 * time.Second,
		IdleCheck:        2 * time.Second,
		StartupTimeout:   2 * time.Minute,
		StreamWindow:     2500 * time.Millisecond,
		DrainDelay:       2 * time.Second,
	}
}

// Validate checks c: a zero value is an error unless the field's comment
// gives it a meaning; nothing is filled in.
func (c *Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	u, err := url.Parse(c.EngineURL)
	check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "", "--engine-url %q: want http://host:port", c.EngineURL)
	check(zmqEndpoint(c.KVEvents), "--kv-events %q: want tcp://, ipc:// or inproc://", c.KVEvents)
	check(c.Replay == "" || zmqEndpoint(c.Replay), "--replay %q: want tcp://, ipc:// or inproc://, or empty for none", c.Replay)
	check(c.DataParallelSize >= 1 && c.DataParallelSize <= 1024, "--data-parallel-size %d: want 1..1024", c.DataParallelSize)
	check(c.P2PPort == 0 || c.P2PPort >= 1 && c.P2PPort+max(c.DataParallelSize, 1)-1 <= 65535,
		"--p2p-port %d: want 0 (no P2P tier) or a port whose last rank's (port+%d) is at most 65535", c.P2PPort, max(c.DataParallelSize, 1)-1)
	check((c.GRPCTLSCert == "") == (c.GRPCTLSKey == ""), "--grpc-tls-cert and --grpc-tls-key go together")
	check(c.GRPCClientCA == "" || c.GRPCTLSCert != "", "--grpc-client-ca needs --grpc-tls-cert and --grpc-tls-key: client certificates are asked for in a TLS handshake")
	check(c.GRPCTLSCert == "" || c.GRPCListen != "", "--grpc-tls-cert without --grpc-listen: the gRPC server is off")
	check(c.Capacity >= 1 && c.Capacity <= 1<<26, "--capacity %d: want 1..%d blocks", c.Capacity, 1<<26)
	check(c.ScrapeInterval >= 10*time.Millisecond, "--scrape-interval %v: at least 10ms", c.ScrapeInterval)
	check(c.DeltaInterval >= time.Millisecond, "--delta-interval %v: at least 1ms", c.DeltaInterval)
	check(c.ReplayTimeout > 0 && c.StartupTimeout > 0 && c.IdleCheck > 0 && c.ScrapeTimeout > 0, "timeouts must be positive")
	check(c.StreamWindow >= 100*time.Millisecond, "--stream-window %v: at least 100ms", c.StreamWindow)
	check(c.DrainDelay >= 0 && c.DrainDelay <= 10*time.Minute, "--drain-delay %v: want 0 (leave at once) up to 10m", c.DrainDelay)
	_, _, err = net.SplitHostPort(c.AdminListen)
	check(err == nil, "--admin-listen %q: want host:port", c.AdminListen)
	if c.Gossip != nil {
		if c.GRPCListen == "" {
			errs = append(errs, errors.New("gossip needs --grpc-listen: pickers find the sidecar to dial it"))
		}
		if err := c.Gossip.Validate(); err != nil {
			errs = append(errs, err)
		}
		if c.FaultInjection && c.Gossip.BindPorts != 1 {
			errs = append(errs, fmt.Errorf("fault injection: gossip must bind one exact port (--gossip-ports 1), not %d", c.Gossip.BindPorts))
		}
	} else if c.FaultInjection {
		errs = append(errs, errors.New("fault injection partitions gossip: it needs --gossip-bind"))
	}
	if c.DataParallelSize > 1 {
		for _, ep := range []string{c.KVEvents, c.Replay} {
			if ep != "" {
				if _, err := offsetPort(ep, 1); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if _, err := offsetURL(c.EngineURL, 1); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func zmqEndpoint(ep string) bool {
	return strings.HasPrefix(ep, "tcp://") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// Params returns the summary parameters for the configured capacity.
func (c *Config) Params() summary.Params { return summary.ForCapacity(c.Capacity) }

// offsetPort returns a ZeroMQ endpoint with its port moved by rank (vLLM's
// offset_endpoint_port); inproc names get _dp<rank>.
func offsetPort(endpoint string, rank int) (string, error) {
	if rank == 0 {
		return endpoint, nil
	}
	if strings.HasPrefix(endpoint, "inproc://") {
		return fmt.Sprintf("%s_dp%d", endpoint, rank), nil
	}
	i := strings.LastIndex(endpoint, ":")
	port, err := strconv.Atoi(endpoint[i+1:])
	if !strings.HasPrefix(endpoint, "tcp://") || err != nil {
		return "", fmt.Errorf("endpoint %q: data-parallel ranks need tcp://host:port", endpoint)
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}

// kvSourceAddr is rank's P2P side-channel address, host:port: the host
// of its engine URL, the port p2pPort+rank (as vLLM binds it); "" when
// p2pPort is 0 (no P2P tier).
func kvSourceAddr(engineURL string, p2pPort, rank int) (string, error) {
	if p2pPort == 0 {
		return "", nil
	}
	u, err := url.Parse(engineURL)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("--p2p-port: the engine URL %q names no host to advertise", engineURL)
	}
	return net.JoinHostPort(u.Hostname(), strconv.Itoa(p2pPort+rank)), nil
}

// offsetURL moves an http URL's port by rank.
func offsetURL(raw string, rank int) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if rank == 0 {
		return raw, nil
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return "", fmt.Errorf("--engine-url %q: data-parallel ranks need an explicit port", raw)
	}
	u.Host = u.Hostname() + ":" + strconv.Itoa(port+rank)
	return u.String(), nil
}
