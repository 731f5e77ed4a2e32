package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/sidecar"
)

// Help shared by the sidecar's and the picker's gossip flags.
const (
	nodeNameHelp    = "unique gossip member name; {role} and {port} in it become the role and the gossip port (the advertised one when given, else the one bound)"
	gossipBindHelp  = "gossip address (UDP and TCP); when its port is taken, the next free one of --gossip-ports is used; off loopback (e.g. 0.0.0.0:7946, across hosts) it needs --gossip-key-file or --gossip-insecure; empty disables gossip"
	gossipPortsHelp = "ports tried from --gossip-bind's up until one is free, so processes sharing a host each bind one (1: exactly that port; 1 when --gossip-advertise is given)"
)

// applyGossipFlags sets the bind and advertise addresses (host:port). An
// advertised port is what others dial, so the bind port stays exact with
// one unless --gossip-ports says otherwise (then Validate refuses it).
func applyGossipFlags(g *gossip.Config, bind, advertise string, fl *pflag.FlagSet) error {
	host, port, err := net.SplitHostPort(bind)
	if err != nil {
		return fmt.Errorf("--gossip-bind %q: want host:port", bind)
	}
	if g.BindPort, err = strconv.Atoi(port); err != nil {
		return fmt.Errorf("--gossip-bind %q: bad port", bind)
	}
	g.BindAddr = host
	if advertise != "" {
		host, port, err := net.SplitHostPort(advertise)
		if err != nil {
			return fmt.Errorf("--gossip-advertise %q: want host:port", advertise)
		}
		if g.AdvertisePort, err = strconv.Atoi(port); err != nil {
			return fmt.Errorf("--gossip-advertise %q: bad port", advertise)
		}
		g.AdvertiseAddr = host
		if !fl.Changed("gossip-ports") {
			g.BindPorts = 1
		}
	}
	return nil
}

// applyConfigFile sets every flag named in a JSON file ({"flag-name":
// value, …}) that was not given on the command line: flags win.
func applyConfigFile(fl *pflag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return startError(fmt.Errorf("--config: %w", err))
	}
	var values map[string]any
	if err := json.Unmarshal(data, &values); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	for name, v := range values {
		f := fl.Lookup(name)
		if f == nil || name == "config" {
			return fmt.Errorf("--config %s: unknown setting %q", path, name)
		}
		if f.Changed {
			continue
		}
		s := fmt.Sprint(v)
		if n, ok := v.(float64); ok && n == float64(int64(n)) {
			s = fmt.Sprint(int64(n))
		}
		if err := fl.Set(name, s); err != nil {
			return fmt.Errorf("--config %s: %s: %w", path, name, err)
		}
	}
	return nil
}

// sidecarCommand returns the command, the config its flags fill, and the
// step that completes it (config file, mode) and validates it.
func sidecarCommand() (*cobra.Command, *sidecar.Config, func() error) {
	cfg := sidecar.DefaultConfig()
	gcfg := gossip.DefaultConfig()
	var mode, configFile, logLevel, gossipBind, gossipAdvertise string
	var cmd *cobra.Command
	finish := func() error {
		if configFile != "" {
			if err := applyConfigFile(cmd.Flags(), configFile); err != nil {
				return err
			}
		}
		switch mode {
		case "connect":
			cfg.Bind = false
		case "bind":
			cfg.Bind = true
		default:
			return fmt.Errorf("--kv-events-mode %q: want connect or bind", mode)
		}
		cfg.Gossip = nil
		if gossipBind != "" {
			if err := applyGossipFlags(&gcfg, gossipBind, gossipAdvertise, cmd.Flags()); err != nil {
				return err
			}
			cfg.Gossip = &gcfg
		}
		return cfg.Validate()
	}
	cmd = &cobra.Command{
		Use:   "sidecar",
		Short: "Turn one vLLM pod's KV-cache events into a live index and summary",
		Long: `Run beside a vLLM pod: follow the engine's KV-cache events over ZeroMQ (one
endpoint per data-parallel rank), keep an exact index of the blocks it holds
under canonical keys, and maintain a compact summary for pickers.

Gaps in the event stream are filled from the engine's replay socket; engine
restarts (seq going backwards, a new process start time) and AllBlocksCleared
clear the endpoint and bump its epoch. Debug endpoints: /healthz, /readyz,
/metrics, /debug/state, /debug/keys?canonical=…|engine=…, /debug/events.

vLLM binds its event socket when the --kv-events-config endpoint has a
wildcard host (tcp://*:5557) and connects when it names a host: use the
default --kv-events-mode connect with the first, bind with the second. The
sidecar judges each rank's live stream from the engine's counters (new
blocks computed, no live batch within --stream-window): stream_state live,
replay_only, silent, partial or unknown, with the fix in stream_reason, in
/debug/state, kvroute_sidecar_stream_state, a warning per change and every
load report. /readyz only says the sidecar can serve (engine answered,
intake open): a silent stream is served by load only, not "not ready".

Settings may also come from a JSON file (--config) whose keys are flag
names; flags given on the command line win. Summaries and load reports are
served to pickers over gRPC (kvroute.v1.Sidecar/WatchSummaries: a snapshot,
then numbered deltas); the sidecar gossips its gRPC address, identity group
and summary positions (memberlist; encrypted with --gossip-key-file, whose
keys are re-read when the file changes and on SIGHUP, for rotation without
downtime).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, ctx, done, err := prepare(finish, logLevel)
			if err != nil {
				return err
			}
			defer done()
			// The process's own figures too (go_goroutines, process_resident_memory_bytes),
			// for soak runs.
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			s, err := sidecar.Start(ctx, cfg, log, reg)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sidecar admin on http://%s\n", s.DebugAddr())
			serveUntilSignal(ctx, s.Members(), log)
			// Tell the pickers first, then leave: a second signal cuts the
			// drain short.
			again, stopAgain := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			s.Drain(again, "shutting down: "+context.Cause(ctx).Error())
			stopAgain()
			s.Close()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.EngineURL, "engine-url", cfg.EngineURL, "rank 0's vLLM HTTP base URL; rank r uses port+r")
	f.StringVar(&cfg.KVEvents, "kv-events", cfg.KVEvents, "rank 0's KV event endpoint; rank r uses port+r")
	f.StringVar(&mode, "kv-events-mode", "connect", "connect to the engine's PUB (vLLM binds on a wildcard host) or bind (vLLM connects)")
	f.StringVar(&cfg.Replay, "replay", cfg.Replay, "rank 0's replay endpoint; rank r uses port+r; empty disables replay")
	f.StringVar(&cfg.Topic, "topic", cfg.Topic, "event topic prefix to subscribe to (empty: all)")
	f.IntVar(&cfg.DataParallelSize, "data-parallel-size", cfg.DataParallelSize, "data-parallel ranks served by the pod, one endpoint each")
	f.IntVar(&cfg.P2PPort, "p2p-port", cfg.P2PPort, "rank 0's P2P side-channel port (vLLM's VLLM_P2P_SIDE_CHANNEL_PORT, 5710 by default, plus the pod's first data-parallel rank when the group spans pods); rank r advertises port+r on the engine URL's host as the address peers pull its CPU-tier KV from; 0: the engine runs no P2P tier and is never named as a source")
	f.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "admin HTTP address: /healthz, /readyz, /metrics, /debug/*")
	f.StringVar(&cfg.AdminAdvertise, "admin-advertise", "", "admin address others reach (kvroute verify, through the pickers' /debug/endpoints) (default: the listen address; the gossip host when listening on every interface)")
	f.StringVar(&cfg.AdminListen, "debug-listen", cfg.AdminListen, "")
	f.StringVar(&cfg.AdminAdvertise, "debug-advertise", "", "")
	_ = f.MarkDeprecated("debug-listen", "use --admin-listen")
	_ = f.MarkDeprecated("debug-advertise", "use --admin-advertise")
	f.StringVar(&cfg.GRPCListen, "grpc-listen", cfg.GRPCListen, "gRPC address serving summaries to pickers (kvroute.v1.Sidecar); empty disables")
	f.StringVar(&cfg.GRPCTLSCert, "grpc-tls-cert", "", "TLS certificate file for the gRPC server (with --grpc-tls-key)")
	f.StringVar(&cfg.GRPCTLSKey, "grpc-tls-key", "", "TLS key file for the gRPC server")
	f.StringVar(&cfg.GRPCClientCA, "grpc-client-ca", "", "CA bundle (PEM) the gRPC server requires pickers' client certificates to be signed by (mutual TLS; needs --grpc-tls-cert); the three TLS files are re-read when they change")
	f.StringVar(&cfg.Model, "model", "", "canonical model name (default: the engine's first model on /v1/models)")
	f.IntVar(&cfg.Capacity, "capacity", cfg.Capacity, "cached blocks per endpoint the summaries are sized for (fleet-wide)")
	f.DurationVar(&cfg.ScrapeInterval, "scrape-interval", cfg.ScrapeInterval, "how often to read the engine's /metrics")
	f.DurationVar(&cfg.ScrapeTimeout, "scrape-timeout", cfg.ScrapeTimeout, "bound on one /metrics read; past it the engine is reported down (hung) until one answers")
	f.DurationVar(&cfg.DeltaInterval, "delta-interval", cfg.DeltaInterval, "how often summary bit flips become a delta")
	f.DurationVar(&cfg.ReplayTimeout, "replay-timeout", cfg.ReplayTimeout, "bound on one replay exchange")
	f.DurationVar(&cfg.IdleCheck, "idle-check", cfg.IdleCheck, "after this long without events, ask the replay ring for anything newer")
	f.DurationVar(&cfg.StartupTimeout, "startup-timeout", cfg.StartupTimeout, "how long to wait for the engine to answer at start")
	f.DurationVar(&cfg.StreamWindow, "stream-window", cfg.StreamWindow, "how long the engine may show new blocks with no live event batch before the stream is reported silent or replay_only (keep it above --idle-check)")
	f.DurationVar(&cfg.DrainDelay, "drain-delay", cfg.DrainDelay, "on SIGTERM, how long to keep telling pickers the engines are draining before leaving (ends early when no picker watches; 0: leave at once)")
	f.StringVar(&cfg.GRPCAdvertise, "grpc-advertise", "", "gRPC address pickers dial, gossiped (default: the listen address; the gossip host when listening on every interface)")
	f.StringSliceVar(&gcfg.Join, "join", nil, "gossip members to join: host:port entries or a DNS name resolving to several (a headless Service)")
	f.StringVar(&gossipBind, "gossip-bind", "127.0.0.1:7946", gossipBindHelp)
	f.IntVar(&gcfg.BindPorts, "gossip-ports", gcfg.BindPorts, gossipPortsHelp)
	f.StringVar(&gossipAdvertise, "gossip-advertise", "", "gossip address others dial (default: the bind address)")
	f.StringVar(&gcfg.KeyFile, "gossip-key-file", "", "gossip keyring: one base64 key (16, 24 or 32 bytes) a line, the first primary; re-read when it changes and on SIGHUP")
	f.BoolVar(&gcfg.Insecure, "gossip-insecure", false, "allow gossip without --gossip-key-file on an address off loopback (anyone reaching the port can join and advertise endpoints); warned at start, kvroute_gossip_insecure 1")
	f.StringVar(&gcfg.NodeName, "node-name", gcfg.NodeName, nodeNameHelp)
	f.StringVar(&configFile, "config", "", "JSON file of settings keyed by flag name; flags win")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	// Fault injection, for kvroute bench --scenario faults and tests only:
	// hidden, off by default.
	f.BoolVar(&cfg.FaultInjection, "fault-injection", false, "FAULT INJECTION, for benchmarks and tests only: POST /debug/fault/gossip on the debug listener partitions this sidecar's gossip (needs --gossip-ports 1)")
	_ = f.MarkHidden("fault-injection")
	return cmd, &cfg, finish
}

// serveUntilSignal waits for ctx (SIGINT, SIGTERM) and meanwhile re-reads
// the gossip keyring at once on SIGHUP (gossip also re-reads it when the
// file changes).
func serveUntilSignal(ctx context.Context, m *gossip.Members, log *zap.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if m == nil {
				continue
			}
			if err := m.ReloadKeys(); err != nil {
				log.Error("reloading gossip keys", zap.Error(err))
			} else {
				log.Info("gossip keys reloaded")
			}
		}
	}
}

// prepare is a long-running command's start: settings checked (a usage
// error otherwise, but for a file that cannot be read), a logger, and a context ended by SIGINT or SIGTERM;
// done releases them.
func prepare(finish func() error, logLevel string) (*zap.Logger, context.Context, func(), error) {
	if err := finish(); err != nil {
		return nil, nil, nil, usageError(err)
	}
	log, err := newLogger(logLevel)
	if err != nil {
		return nil, nil, nil, usageError(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	return log, ctx, func() { stop(); _ = log.Sync() }, nil
}
