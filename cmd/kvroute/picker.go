package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/extproc"
	"github.com/kvroute/kvroute/picker/peers"
	"github.com/kvroute/kvroute/picker/score"
)

func newPickerCommand() *cobra.Command {
	cmd, _, _ := pickerCommand()
	return cmd
}

// pickerCommand builds `kvroute picker`; finish applies --config and the
// derived settings and validates (tests call it without running).
func pickerCommand() (*cobra.Command, *picker.ServerConfig, func() error) {
	cfg := picker.DefaultServerConfig()
	gcfg := gossip.DefaultConfig()
	var policy, configFile, logLevel, gossipBind, gossipAdvertise, tokenFile, engineKeyFile, eppMode string
	var cmd *cobra.Command
	gate := newLLMDGateFlags()
	finish := func() error {
		if configFile != "" {
			if err := applyConfigFile(cmd.Flags(), configFile); err != nil {
				return err
			}
		}
		p, err := score.ParsePolicy(policy)
		if err != nil {
			return fmt.Errorf("--policy: %w", err)
		}
		cfg.Router.Score.Policy = p
		if err := gate.check(p, cmd.Flags().Changed); err != nil {
			return err
		}
		if cfg.ExtProc.Assume, err = extproc.ParseMode(eppMode); err != nil {
			return fmt.Errorf("--ext-proc-assume-body-mode: %w", err)
		}
		cfg.Gossip = nil
		if gossipBind != "" {
			if err := applyGossipFlags(&gcfg, gossipBind, gossipAdvertise, cmd.Flags()); err != nil {
				return err
			}
			cfg.Gossip = &gcfg
		}
		// The picker reads these files at start and again when they change;
		// a missing or empty one is told here, before anything starts.
		cfg.DecisionToken, cfg.DecisionTokenFile = "", tokenFile
		cfg.Router.EngineAPIKey, cfg.EngineAPIKeyFile = "", engineKeyFile
		for flag, path := range map[string]string{"--decision-token-file": tokenFile, "--engine-api-key-file": engineKeyFile} {
			if path == "" {
				continue
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return startError(fmt.Errorf("%s: %w", flag, err))
			}
			if strings.TrimSpace(string(b)) == "" {
				return startError(fmt.Errorf("%s %s is empty", flag, path))
			}
		}
		return cfg.Validate()
	}
	cmd = &cobra.Command{
		Use:   "picker",
		Short: "Route requests to the endpoint holding the longest cached prefix",
		Long: `Serve the OpenAI endpoints (/v1/chat/completions, /v1/completions,
/v1/responses; proxied, streams passed through byte for byte) and the decision
API (POST /routing/v1/pick, and gRPC kvroute.v1.Picker/Pick) that answers the
endpoint and a prefix_hash without sending the request.

Each request's exact tokens come from an engine of its identity group (vLLM's
render endpoints); its canonical block keys, salted by cache_salt, are matched
against every endpoint's summary (followed from the sidecars found through
gossip, or given with --sidecars); the endpoint with the lowest estimated time
to first token wins under a bounded-load cap. Cold prefixes go by rendezvous
hashing on the request's anchor, so replicas agree without talking.

With --ext-proc-listen the picker is also a Gateway API Inference Extension
endpoint picker: Envoy's ext_proc service, answering each request with
x-gateway-destination-endpoint (the chosen pod's IP:port, then fallbacks), with
gRPC health (liveness, readiness); see docs/gateway-epp.md.

A Responses request carrying previous_response_id is refused (400): rehydrate
the conversation first. Debug: /healthz, /readyz, /metrics, /debug/endpoints,
and ?explain=true on the decision API.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, ctx, done, err := prepare(finish, logLevel)
			if err != nil {
				return err
			}
			defer done()
			// The signal drains, then closes (below): the server's own
			// context is not the signal's.
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			s, err := picker.Start(context.Background(), cfg, log, reg)
			if err != nil {
				return err
			}
			if err := gate.apply(cfg.Router.Score.Policy, s.Router()); err != nil {
				s.Close()
				return usageError(err) // values check refuses first
			}
			fmt.Fprintf(cmd.OutOrStdout(), "picker on http://%s, admin on http://%s", s.Addr(), s.AdminAddr())
			if a := s.GRPCAddr(); a != "" {
				fmt.Fprintf(cmd.OutOrStdout(), ", gRPC on %s", a)
			}
			if a := s.ExtProcAddr(); a != "" {
				fmt.Fprintf(cmd.OutOrStdout(), ", endpoint picker (ext_proc) on %s", a)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			serveUntilSignal(ctx, s.Members(), log)
			// Fail /readyz and serve on for --drain-delay, then stop
			// accepting and let requests in flight finish (up to
			// --shutdown-timeout); a second signal cuts the delay short.
			again, stopAgain := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			s.Drain(again, "shutting down: "+context.Cause(ctx).Error())
			stopAgain()
			s.Close()
			return nil
		},
	}
	f := cmd.Flags()
	r := &cfg.Router
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "public HTTP address: the OpenAI endpoints and the decision API only")
	f.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "admin HTTP address: /healthz, /readyz, /metrics, /debug/*; reachable by probes and monitoring only")
	f.StringVar(&cfg.GRPCListen, "grpc-listen", cfg.GRPCListen, "gRPC address of kvroute.v1.Picker; empty disables")
	f.StringSliceVar(&cfg.Sidecars, "sidecars", nil, "sidecar gRPC addresses to follow besides those gossip finds")
	f.StringVar(&cfg.PeerListen, "peer-listen", cfg.PeerListen, "address the bookings streams to the other pickers are served on, gossiped (a fleet over several hosts: a routable one, e.g. :9001); empty: this picker shares no bookings")
	f.StringSliceVar(&cfg.PeerPickers, "peer-pickers", nil, "the other pickers' --peer-listen addresses, whose bookings this picker follows besides those gossip finds; this picker's own may be listed")
	f.StringVar(&cfg.PeerAdvertise, "peer-advertise", "", "host:port the other pickers dial for this picker's bookings, gossiped; default: --peer-listen as bound (the gossip address's host when it binds every interface)")
	f.DurationVar(&cfg.BookingsFlush, "bookings-flush", cfg.BookingsFlush, "how often this picker's booking changes go to the pickers following them, batched")
	f.DurationVar(&cfg.Router.PeerBookingLifetime, "peer-booking-lifetime", cfg.Router.PeerBookingLifetime, "how long another picker's booking counts here at most, so a lost release leaves no phantom")
	f.StringSliceVar(&cfg.AllowRemoteEndpoints, "allow-remote-endpoints", nil, "networks (CIDRs, or addresses) whose endpoints any sidecar may advertise; none: a sidecar's endpoints are routed only when on its own host (the address the picker dials it at), others refused and listed on /debug/endpoints")
	f.IntVar(&cfg.MaxGroupEndpoints, "max-group-endpoints", cfg.MaxGroupEndpoints, "most endpoints one model (identity group) may hold; more are refused (group_full); each costs --capacity x 2 bytes of index per tier")
	f.StringSliceVar(&cfg.Models, "models", nil, "follow and route only these models (names as the sidecars report them), for picker replicas sharded by model; other models' sidecars are not streamed and their requests get 404; none: every model")
	f.StringSliceVar(&gcfg.Join, "join", nil, "gossip members to join: host:port entries or a DNS name resolving to several (a headless Service)")
	f.StringVar(&gossipBind, "gossip-bind", "127.0.0.1:7946", gossipBindHelp)
	f.IntVar(&gcfg.BindPorts, "gossip-ports", gcfg.BindPorts, gossipPortsHelp)
	f.StringVar(&gossipAdvertise, "gossip-advertise", "", "gossip address others dial (default: the bind address)")
	f.StringVar(&gcfg.KeyFile, "gossip-key-file", "", "gossip keyring: one base64 key (16, 24 or 32 bytes) a line, the first primary; re-read when it changes and on SIGHUP")
	f.BoolVar(&gcfg.Insecure, "gossip-insecure", false, "allow gossip without --gossip-key-file on an address off loopback (anyone reaching the port can join and advertise endpoints); warned at start, kvroute_gossip_insecure 1")
	f.StringVar(&gcfg.NodeName, "node-name", gcfg.NodeName, nodeNameHelp)
	f.StringVar(&policy, "policy", string(score.Precise), "routing policy: precise, prefix-hash, least-loaded or round-robin (the last three are baselines); llm-d, llm-d-precise, dynamo or sglang re-implement the peers' policies, and llm-d-precise+p2p, llm-d+p2p, llm-d-load, llm-d-load+p2p or dynamo+hint their arms with KV pulls, for comparison")
	f.BoolVar(&cfg.Router.Pulls, "kv-pulls", cfg.Router.Pulls, "let precise name a KV source: the chosen engine pulls the prefix from another engine's CPU tier (vLLM's P2P tier) when that is predicted faster than recomputing; needs sidecars with --p2p-port")
	f.Uint64Var(&r.PolicySeed, "policy-seed", r.PolicySeed, "seed of a peer policy's random tie-breaks (reproducible comparison runs)")
	gate.register(f)
	f.Float64Var(&r.Score.Epsilon, "load-epsilon", r.Score.Epsilon, "bounded-load factor ε: no endpoint above ⌈(1+ε)·mean⌉ in flight while another is under it")
	f.IntVar(&r.Score.MinCap, "min-load-cap", r.Score.MinCap, "the load cap never goes below this many requests in flight")
	f.DurationVar(&r.TokenizeTimeout, "tokenize-timeout", r.TokenizeTimeout, "bound on one render call; past it the request is placed by consistent hashing (counted)")
	f.StringVar(&r.Unresolved, "unresolved", r.Unresolved, "requests whose cache identity cannot be resolved exactly: reject (400), precise-only (score what is known) or load-only")
	f.IntVar(&r.AnchorTokens, "anchor-tokens", r.AnchorTokens, "anchor of a raw prompt (completions, token ids): its first N tokens")
	f.StringVar(&r.ResponseHeaders, "response-headers", r.ResponseHeaders, "x-kvroute-* headers on proxied answers: all, decision (no pod address) or none; the decision API is unaffected")
	f.Float64Var(&r.AccessLog, "access-log", r.AccessLog, "share of requests the access log records, one info line each without prompt text: 1 every one, 0 off, 0.1 one in ten")
	f.BoolVar(&r.PerEndpointMetrics, "per-endpoint-metrics", r.PerEndpointMetrics, "label every metric that can name an endpoint by it (engine): in-flight requests, stream aborts, KV sources, TTFT speed factors and every health state; "+
		"off, an endpoint has three series (selected_total, its current health state, its staleness) and the rest are summed over the endpoints")
	f.Float64Var(&r.Admission.MaxWaiting, "saturation-waiting", r.Admission.MaxWaiting, "admission: an endpoint with at least this many requests queued at its engine (reported, plus picks not yet reported) is saturated; 0 does not check")
	f.Float64Var(&r.Admission.MaxKVUsage, "saturation-kv-usage", r.Admission.MaxKVUsage, "admission: an endpoint whose engine reports at least this share of its KV cache in use (0..1) is saturated; 0 does not check")
	f.Float64Var(&r.Admission.MaxPrefillTokens, "saturation-prefill-tokens", r.Admission.MaxPrefillTokens, "admission: an endpoint with at least this many uncached prompt tokens from this picker before their first byte is saturated; 0 does not check")
	f.IntVar(&r.Admission.QueueSize, "queue-size", r.Admission.QueueSize, "admission: requests that may wait per model group while every routable endpoint of it is saturated; past it, 429 with Retry-After (0: shed at once)")
	f.DurationVar(&r.Admission.QueueTimeout, "queue-timeout", r.Admission.QueueTimeout, "admission: how long a request may wait for room; past it, 429 with Retry-After")
	f.DurationVar(&r.Admission.LIFOAfter, "queue-lifo-after", r.Admission.LIFOAfter, "admission: once a fairness key's oldest waiter has waited this long (the queue stands), its newest go first, so those released wait little and the rest expire (0: arrival order)")
	f.DurationVar(&r.Admission.StandingTimeout, "queue-standing-timeout", r.Admission.StandingTimeout, "admission: once the queue has stood (oldest waiter past --queue-lifo-after) this long, requests that waited longer get 429: under sustained overload none is served after waiting more (0: only --queue-timeout)")
	f.StringVar(&r.TenantHeader, "tenant-header", r.TenantHeader, "header the authenticating gateway in front sets to the request's tenant: each request's cache_salt is then derived from it (keyed by --salt-key-file), replacing any the client sent; none: the client's cache_salt stands")
	f.StringVar(&cfg.SaltKeyFile, "salt-key-file", "", "file holding the key tenant salts are derived with (at least 16 bytes, e.g. openssl rand -base64 32), re-read when it changes; needed with --tenant-header")
	f.BoolVar(&r.RequireTenant, "require-tenant", false, "refuse requests without the --tenant-header header (401)")
	f.BoolVar(&r.AdmitDecisions, "admit-decisions", false, "admission: the decision API answers 429 with Retry-After (gRPC: RESOURCE_EXHAUSTED with RetryInfo) instead of a decision while the model is saturated or requests for it wait; off: it always decides")
	f.StringVar(&r.FairnessHeader, "fairness-header", r.FairnessHeader, "admission: header whose value is a request's fairness key (else its cache_salt, else one shared key); x-kvroute-priority sets its band")
	f.BoolVar(&r.EnginePriority, "engine-priority", r.EnginePriority, "set vLLM's request priority on each forwarded request (and in the decision API's answer): the x-kvroute-priority band first, then the fairness key's standing against its fair share of recent prompt tokens, so a tenant within its share runs before one beyond it inside the engine; the engines must run --scheduling-policy priority (one that refuses gets the request again without a priority, counted in kvroute_picker_engine_priority_refused_total)")
	f.Int64Var(&r.MaxBodyBytes, "max-body-bytes", r.MaxBodyBytes, "largest request body accepted (413 beyond)")
	f.DurationVar(&r.Health.StaleSummary, "stale-summary", r.Health.StaleSummary, "an endpoint whose sidecar sent nothing for this long is routed by load only (no cache credit)")
	f.DurationVar(&r.Health.DownAfter, "down-after", r.Health.DownAfter, "an endpoint whose sidecar sent nothing for this long gets no requests")
	f.DurationVar(&r.Health.SidecarGrace, "sidecar-grace", r.Health.SidecarGrace, "an endpoint whose sidecar is lost stays routable by load this long while its engine answers the picker's health probe")
	f.DurationVar(&r.Health.EjectBase, "eject-base", r.Health.EjectBase, "an engine the picker fails to reach is ejected this long (doubling on repeats), then probed")
	f.DurationVar(&r.Health.EjectMax, "eject-max", r.Health.EjectMax, "the longest ejection")
	f.IntVar(&cfg.Capacity, "capacity", cfg.Capacity, "cached blocks per endpoint the summaries are sized for: the sidecars' --capacity")
	f.StringVar(&tokenFile, "decision-token-file", "", "file holding the bearer token the decision API requires (HTTP and gRPC), re-read when it changes; none: open")
	f.StringVar(&engineKeyFile, "engine-api-key-file", "", "file holding the engines' --api-key, sent on the picker's own render and model-list calls; re-read when it changes")
	f.StringVar(&cfg.ExtProcListen, "ext-proc-listen", "", "gRPC address of the endpoint picker (Envoy ext_proc, Gateway API Inference Extension protocol, with gRPC health), e.g. :9002; empty disables")
	f.StringVar(&cfg.ExtProcTLSCert, "ext-proc-tls-cert", "", "PEM certificate the endpoint picker serves TLS with (with --ext-proc-tls-key); none: plaintext")
	f.StringVar(&cfg.ExtProcTLSKey, "ext-proc-tls-key", "", "PEM key of --ext-proc-tls-cert")
	f.StringVar(&cfg.ExtProcClientCA, "ext-proc-client-ca", "", "CA bundle (PEM) the endpoint picker requires the gateway's client certificate to be signed by (mutual TLS; needs --ext-proc-tls-cert); TLS files are re-read when they change")
	f.StringVar(&cfg.GRPCTLSCert, "grpc-tls-cert", "", "PEM certificate the gRPC decision API (--grpc-listen) serves TLS with (with --grpc-tls-key); none: plaintext")
	f.StringVar(&cfg.GRPCTLSKey, "grpc-tls-key", "", "PEM key of --grpc-tls-cert")
	f.StringVar(&cfg.GRPCClientCA, "grpc-client-ca", "", "CA bundle (PEM) the gRPC decision API requires client certificates to be signed by (mutual TLS; needs --grpc-tls-cert)")
	f.StringVar(&cfg.SidecarTLSCA, "sidecar-tls-ca", "", "CA bundle (PEM) the sidecars' gRPC certificates are verified against: the summary streams are then dialled over TLS; none: plaintext")
	f.StringVar(&cfg.SidecarTLSCert, "sidecar-tls-cert", "", "PEM client certificate presented to sidecars that require one (--grpc-client-ca on the sidecar); with --sidecar-tls-key and --sidecar-tls-ca")
	f.StringVar(&cfg.SidecarTLSKey, "sidecar-tls-key", "", "PEM key of --sidecar-tls-cert")
	f.StringVar(&cfg.PeerTLSCert, "peer-tls-cert", "", "PEM certificate (server and client auth) the bookings streams between pickers are served and followed with (mutual TLS, with --peer-tls-key and --peer-tls-ca); none: plaintext")
	f.StringVar(&cfg.PeerTLSKey, "peer-tls-key", "", "PEM key of --peer-tls-cert")
	f.StringVar(&cfg.PeerTLSCA, "peer-tls-ca", "", "CA bundle (PEM) the other pickers' certificates must chain to, as followers and as the followed")
	f.StringVar(&cfg.PeerTLSServerName, "peer-tls-server-name", "", "name the other pickers' certificates are verified for; default: the host dialled")
	f.StringVar(&cfg.SidecarTLSServerName, "sidecar-tls-server-name", "", "name the sidecars' certificates are verified for, when they are not issued for the addresses the picker dials (pod IPs), e.g. kvroute-sidecars; default: the host dialled")
	f.IntVar(&cfg.ExtProc.Fallbacks, "ext-proc-fallbacks", cfg.ExtProc.Fallbacks, "endpoints after the picked one in x-gateway-destination-endpoint, for the gateway's retries (0..7)")
	f.Float64Var(&cfg.ExtProc.ShedWaiting, "ext-proc-shed-waiting", cfg.ExtProc.ShedWaiting, "answer 429 when every candidate endpoint has at least this many requests waiting (its engine's queue plus picks not yet reported); 0 never sheds")
	f.DurationVar(&cfg.ExtProc.BodyTimeout, "ext-proc-body-timeout", cfg.ExtProc.BodyTimeout, "bound on the wait from a request's headers to the end of its body at the endpoint picker")
	f.StringVar(&eppMode, "ext-proc-assume-body-mode", "full-duplex-streamed", "body mode assumed when the gateway does not announce one (protocol_config): full-duplex-streamed, streamed or buffered")
	f.DurationVar(&cfg.DrainDelay, "drain-delay", cfg.DrainDelay, "on SIGTERM, how long to keep serving with /readyz failing before stopping accepting (0: at once)")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "once it stops accepting, how long requests in flight (streams too) may take to finish before they are cut")
	f.StringVar(&configFile, "config", "", "JSON file of settings keyed by flag name; flags win")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd, &cfg, finish
}

// llmdGateFlags are --policy llm-d's load gate (the prefix-cache-affinity
// filter's): the peak prefill throughput and the TTFT penalty, τ = peak ×
// penalty, at llm-d's guide's values unless given.
type llmdGateFlags struct {
	peak    float64
	penalty time.Duration
}

// The gate's flags.
const (
	flagLLMDPeak    = "llmd-peak-prefill-throughput"
	flagLLMDPenalty = "llmd-max-ttft-penalty"
)

func newLLMDGateFlags() *llmdGateFlags {
	d := peers.DefaultLLMDConfig()
	return &llmdGateFlags{peak: d.PeakPrefillThroughput, penalty: time.Duration(d.MaxTTFTPenaltyMs * float64(time.Millisecond))}
}

func (g *llmdGateFlags) register(f *pflag.FlagSet) {
	f.Float64Var(&g.peak, flagLLMDPeak, g.peak, "with --policy llm-d: the prefix-cache-affinity filter's peakPrefillThroughput, in prompt tokens per second, "+
		"which turns an endpoint's in-flight tokens into an estimated TTFT; the default is llm-d's guide's (Qwen3-32B on H100, TP 2, 8,192-token chunks): "+
		"measure your engines' own (kvroute bench's llm-d-calibrated does, by llm-d's recipe)")
	f.DurationVar(&g.penalty, flagLLMDPenalty, g.penalty, "with --policy llm-d: the filter's maxTTFTPenaltyMs: stickiness breaks once the least loaded sticky "+
		"endpoint's estimated TTFT exceeds the least loaded other one's by more, i.e. past τ = peak × this in-flight tokens (0: never breaks)")
}

// check refuses the gate's flags given with another policy, and values
// the llm-d policy would refuse.
func (g *llmdGateFlags) check(policy score.Policy, changed func(string) bool) error {
	if policy != score.LLMD {
		for _, name := range []string{flagLLMDPeak, flagLLMDPenalty} {
			if changed(name) {
				return fmt.Errorf("--%s is for --policy llm-d, not %s", name, policy)
			}
		}
		return nil
	}
	if !(g.peak > 0) || math.IsInf(g.peak, 0) {
		return fmt.Errorf("--%s %v: want a positive number of tokens per second", flagLLMDPeak, g.peak)
	}
	if g.penalty < 0 {
		return fmt.Errorf("--%s %v: want a duration, 0 to never break stickiness", flagLLMDPenalty, g.penalty)
	}
	return nil
}

// apply sets the gate on a router running llm-d (after it started: the
// router takes no peer settings at its construction).
func (g *llmdGateFlags) apply(policy score.Policy, r *picker.Router) error {
	if policy != score.LLMD {
		return nil
	}
	if err := r.SetLLMDLoadGate(g.peak, g.penalty); err != nil {
		return fmt.Errorf("--%s, --%s: %w", flagLLMDPeak, flagLLMDPenalty, err)
	}
	return nil
}
