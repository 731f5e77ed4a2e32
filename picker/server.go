package picker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/gossip/secretfile"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/extproc"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/fleetview"
)

// ServerConfig configures a picker process. Start from
// DefaultServerConfig: a zero field is invalid, not a default, and
// Validate says which (GRPCListen, Gossip, Sidecars and DecisionToken are
// optional, as documented on each).
type ServerConfig struct {
	Router Config
	// Listen serves the public API: the OpenAI endpoints and the decision
	// API, nothing else. Default ":8080".
	Listen string
	// AdminListen serves the admin surface: /healthz, /readyz, /metrics
	// and /debug/*, for probes, monitoring and operators only. Default
	// ":8081".
	AdminListen string
	// GRPCListen serves kvroute.v1.Picker; empty disables it. Default ":9000".
	GRPCListen string
	// Gossip, when set, finds sidecars through memberlist.
	Gossip *gossip.Config
	// Sidecars are sidecar gRPC addresses to follow besides (or instead
	// of) those gossip finds.
	Sidecars []string
	// PeerPickers are the gRPC addresses (host:port) of the other pickers
	// of this fleet, whose bookings this picker follows besides (or
	// instead of) those gossip finds (--peer-pickers). The picker's own
	// address may be listed: it is recognised and skipped.
	PeerPickers []string
	// PeerListen serves this picker's bookings to the other pickers of
	// the fleet (kvroute.v1.Bookings), who find it through gossip or
	// --peer-pickers (--peer-listen); "" turns the sharing off. Default
	// 127.0.0.1:0, a port of its own on loopback, gossiped: the pickers of
	// one host share their bookings with no flag; a fleet over several
	// hosts listens on a routable address (the deploy manifests: :9001).
	PeerListen string
	// PeerAdvertise is the address (host:port) other pickers dial for
	// this picker's bookings, gossiped in its metadata
	// (--peer-advertise). Default: --peer-listen's address as bound, with
	// the gossip address's host when it binds every interface.
	PeerAdvertise string
	// BookingsFlush is how often this picker's booking changes go to the
	// pickers following them, batched (--bookings-flush). Default 5 ms.
	BookingsFlush time.Duration
	// PeerTLSCert, PeerTLSKey and PeerTLSCA, when set (all three or
	// none), make the bookings streams mutual TLS: the picker serves them
	// with this certificate and requires the followers' certificates to
	// chain to the CA bundle, and follows the other pickers presenting it,
	// verifying theirs against the bundle for PeerTLSServerName (default:
	// the host dialled). The certificate needs server and client auth.
	PeerTLSCert, PeerTLSKey, PeerTLSCA, PeerTLSServerName string
	// AllowRemoteEndpoints are networks (CIDRs, or single addresses) whose
	// endpoints any sidecar may advertise (--allow-remote-endpoints).
	// Default none: a sidecar's endpoints are routed only when on its own
	// host, the host of the address the picker dials it at (package
	// picker/trust); the others are refused, counted and listed.
	AllowRemoteEndpoints []string
	// Models, when set, are the only models this picker follows and
	// routes (--models: picker replicas sharded by model); sidecars of
	// other models are never streamed and requests for them get 404
	// model_not_found saying this shard does not serve them. Entries are
	// model names as the sidecars report them, none empty. Default none:
	// every model.
	Models []string
	// Capacity sizes the summaries, as the sidecars' --capacity (fleet-wide).
	// Default 65536.
	Capacity int
	// MaxGroupEndpoints bounds the endpoints of one identity group (a
	// model); the next is refused (group_full). Each costs Capacity×2
	// bytes of index per tier. 1..16,384; default 1,024.
	MaxGroupEndpoints int
	// DecisionToken, when set, protects the decision API (HTTP and gRPC).
	DecisionToken string
	// DecisionTokenFile, when set, holds the decision API's token instead
	// (white space trimmed), re-read when the file changes.
	DecisionTokenFile string
	// EngineAPIKeyFile, when set, holds Router.EngineAPIKey instead, re-read
	// when the file changes.
	EngineAPIKeyFile string
	// SaltKeyFile holds the key tenant salts are derived with
	// (Router.TenantHeader): at least 16 bytes, white space trimmed,
	// re-read when the file changes. Required with a tenant header.
	SaltKeyFile string
	// ExtProcListen serves the endpoint picker (Envoy ext_proc, the
	// Gateway API Inference Extension's protocol: picker/extproc) with
	// gRPC health; empty (the default) disables it.
	ExtProcListen string
	// ExtProc configures the endpoint picker.
	ExtProc extproc.Config
	// ExtProcTLSCert and ExtProcTLSKey, when set (both or neither), are
	// the PEM certificate and key the endpoint picker serves TLS with.
	ExtProcTLSCert, ExtProcTLSKey string
	// ExtProcClientCA, when set, makes the endpoint picker require client
	// certificates verified against this PEM CA bundle (needs
	// ExtProcTLSCert).
	ExtProcClientCA string
	// GRPCTLSCert and GRPCTLSKey, when set (both or neither), are the PEM
	// certificate and key the gRPC decision API serves TLS with;
	// GRPCClientCA, when set, makes it require client certificates
	// verified against this PEM CA bundle (needs GRPCTLSCert).
	GRPCTLSCert, GRPCTLSKey, GRPCClientCA string
	// SidecarTLSCA, when set, makes the picker dial the sidecars' summary
	// streams over TLS, verifying their certificates against this PEM CA
	// bundle for SidecarTLSServerName (default: the host dialled);
	// SidecarTLSCert and SidecarTLSKey (both or neither, and only with
	// SidecarTLSCA) are the client certificate presented, for sidecars
	// that require one. Default plaintext.
	SidecarTLSCert, SidecarTLSKey, SidecarTLSCA, SidecarTLSServerName string
	// Every TLS file (certificates, keys, CA bundles) is re-read when it
	// changes, as the secret files are: new connections take the new
	// material, connections open keep theirs.
	// DrainDelay is how long Drain keeps serving with /readyz failing, so
	// load balancers and gateways stop sending before the picker stops
	// accepting. Default 5 s; 0 stops at once.
	DrainDelay time.Duration
	// ShutdownTimeout bounds how long Close lets requests in flight (long
	// streams included) finish once the picker stops accepting; past it
	// they are cut. Default 30 s.
	ShutdownTimeout time.Duration
}

// DefaultServerConfig returns the defaults.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{Router: DefaultConfig(), Listen: ":8080", AdminListen: ":8081", GRPCListen: ":9000", Capacity: 65536, MaxGroupEndpoints: fleet.DefaultSlots, ExtProc: extproc.DefaultConfig(),
		DrainDelay: 5 * time.Second, ShutdownTimeout: 30 * time.Second, PeerListen: "127.0.0.1:0", BookingsFlush: 5 * time.Millisecond}
}

// sharesBookings reports whether the picker streams its bookings to the
// other pickers and follows theirs: it has a port to serve them on and a
// way to find the others (gossip, --peer-pickers).
func (c *ServerConfig) sharesBookings() bool {
	return c.PeerListen != "" && (c.Gossip != nil || len(c.PeerPickers) > 0)
}

// Validate checks c.
func (c *ServerConfig) Validate() error {
	var errs []error
	if err := c.Router.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Listen == "" {
		errs = append(errs, errors.New("--listen is required"))
	}
	if c.AdminListen == "" {
		errs = append(errs, errors.New("--admin-listen is required: it serves the probes (/healthz, /readyz) and /metrics"))
	} else if _, port, _ := net.SplitHostPort(c.AdminListen); c.AdminListen == c.Listen && port != "0" {
		errs = append(errs, fmt.Errorf("--admin-listen %s is --listen's address: the admin surface needs a port of its own", c.AdminListen))
	}
	if c.DrainDelay < 0 {
		errs = append(errs, fmt.Errorf("--drain-delay %v: want 0 or more", c.DrainDelay))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %v: want a positive duration", c.ShutdownTimeout))
	}
	if c.Capacity < 1 || c.Capacity > 1<<26 {
		errs = append(errs, fmt.Errorf("--capacity %d: want 1..%d blocks", c.Capacity, 1<<26))
	}
	if c.MaxGroupEndpoints < 1 || c.MaxGroupEndpoints > fleet.MaxSlots {
		errs = append(errs, fmt.Errorf("--max-group-endpoints %d: want 1..%d", c.MaxGroupEndpoints, fleet.MaxSlots))
	}
	for _, m := range c.Models {
		if strings.TrimSpace(m) == "" {
			errs = append(errs, errors.New("--models: an empty model name (give names, comma-separated, or none for every model)"))
			break
		}
	}
	if _, err := c.allowRemote(); err != nil {
		errs = append(errs, err)
	}
	if len(c.PeerPickers) > 0 && c.PeerListen == "" {
		errs = append(errs, errors.New("--peer-pickers without --peer-listen: the pickers follow each other's bookings on their --peer-listen ports"))
	}
	for _, a := range c.PeerPickers {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("--peer-pickers %q: want host:port (another picker's --peer-listen)", a))
		}
	}
	if c.PeerAdvertise != "" {
		if _, port, err := net.SplitHostPort(c.PeerAdvertise); err != nil || port == "" || port == "0" {
			errs = append(errs, fmt.Errorf("--peer-advertise %q: want host:port", c.PeerAdvertise))
		}
	}
	if c.BookingsFlush < time.Millisecond || c.BookingsFlush > time.Second {
		errs = append(errs, fmt.Errorf("--bookings-flush %v: want 1ms..1s", c.BookingsFlush))
	}
	if c.Gossip == nil && len(c.Sidecars) == 0 {
		errs = append(errs, errors.New("no way to find sidecars: give --join (gossip) or --sidecars"))
	}
	if c.Gossip != nil {
		if err := c.Gossip.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.ExtProc.Validate(); err != nil {
		errs = append(errs, err)
	}
	if (c.ExtProcTLSCert == "") != (c.ExtProcTLSKey == "") {
		errs = append(errs, errors.New("--ext-proc-tls-cert and --ext-proc-tls-key go together: give both or neither"))
	}
	switch {
	case c.Router.TenantHeader != "" && c.SaltKeyFile == "":
		errs = append(errs, errors.New("--tenant-header needs --salt-key-file: tenant salts are keyed, so they cannot be guessed across deployments"))
	case c.Router.TenantHeader == "" && c.SaltKeyFile != "":
		errs = append(errs, errors.New("--salt-key-file without --tenant-header: no tenant to derive a salt for"))
	}
	if c.DecisionToken != "" && c.DecisionTokenFile != "" {
		errs = append(errs, errors.New("a decision token and --decision-token-file: give one"))
	}
	if c.Router.EngineAPIKey != "" && c.EngineAPIKeyFile != "" {
		errs = append(errs, errors.New("an engine API key and --engine-api-key-file: give one"))
	}
	if c.ExtProcTLSCert != "" && c.ExtProcListen == "" {
		errs = append(errs, errors.New("--ext-proc-tls-cert without --ext-proc-listen: the endpoint picker is off"))
	}
	errs = append(errs, c.validateTLS()...)
	return errors.Join(errs...)
}

// Server is a running picker.
type Server struct {
	log     *zap.Logger
	reg     *prometheus.Registry
	view    *fleetview.View
	router  *Router
	members *gossip.Members
	share   *shareHub // the bookings streams (nil: not shared)
	peerSrv *grpc.Server
	peerLn  net.Listener
	http    *http.Server
	httpLn  net.Listener
	admin   *http.Server
	adminLn net.Listener
	grpc    *grpc.Server
	grpcLn  net.Listener
	epp     *grpc.Server
	eppLn   net.Listener
	cancel  context.CancelFunc
	done    chan struct{}

	cfg      ServerConfig
	token    atomic.Pointer[string] // the decision API's token ("" none)
	drain    atomic.Pointer[string] // the drain's reason, once Drain is called
	draining prometheus.Gauge
}

// Start runs a picker: the fleet view (gossip and/or static sidecars),
// the router, its HTTP API and its gRPC service.
func Start(ctx context.Context, cfg ServerConfig, log *zap.Logger, reg *prometheus.Registry) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s := &Server{log: log, reg: reg, done: make(chan struct{}), cfg: cfg,
		draining: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "picker", Name: "draining",
			Help: "1 once the picker is draining (SIGTERM): /readyz fails, requests in flight finish, then it stops."})}
	reg.MustRegister(s.draining)
	// TLS material and secrets held from files, re-read when they change.
	files := secretfile.NewMetrics(reg, "picker")
	tf, err := openTLS(&cfg, files, log.Named("secrets"))
	if err != nil {
		return nil, err
	}
	if err := s.newRouter(&cfg, tf); err != nil {
		return nil, err
	}
	fail := func(err error) (*Server, error) {
		s.Close()
		return nil, err
	}
	// Secrets held from files, re-read when they change.
	s.token.Store(&cfg.DecisionToken)
	secrets, err := s.openSecrets(&cfg, files, log.Named("secrets"))
	if err != nil {
		return fail(err)
	}
	if err := s.listen(&cfg, tf); err != nil {
		return fail(err)
	}
	for _, addr := range cfg.Sidecars {
		s.view.WatchStatic(addr)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go secretfile.Watch(runCtx, secretfile.Poll, append(tf.files, secrets...)...)
	if cfg.Gossip != nil {
		gcfg := *cfg.Gossip
		gcfg.Secrets = files // the keyring's reloads, counted with the other secrets'
		if s.members, err = gossip.New(gcfg, gossip.Meta{Role: gossip.RolePicker}, log.Named("gossip"), reg); err != nil {
			return fail(err)
		}
		go s.view.FollowGossip(runCtx, s.members)
	}
	if cfg.sharesBookings() {
		if err := s.startShare(runCtx, &cfg, tf); err != nil {
			return fail(err)
		}
	}
	s.serve(&cfg, tf)
	go func() {
		defer close(s.done)
		select {
		case <-ctx.Done():
			s.Close()
		case <-runCtx.Done():
		}
	}()
	return s, nil
}

// newRouter makes the fleet view, following the sidecars as cfg says,
// and the router over it.
func (s *Server) newRouter(cfg *ServerConfig, tf *tlsFiles) error {
	vcfg := fleetview.DefaultConfig()
	vcfg.TLS = tf.sidecars
	vcfg.Params = summary.ForCapacity(cfg.Capacity)
	vcfg.Health = cfg.Router.Health // one judgement for the view and the decisions
	vcfg.Models = cfg.Models
	vcfg.Slots = cfg.MaxGroupEndpoints
	vcfg.AllowRemote, _ = cfg.allowRemote() // valid: checked by Validate
	vcfg.PerEndpointMetrics = cfg.Router.PerEndpointMetrics
	var err error
	if s.view, err = fleetview.New(vcfg, s.log.Named("view"), s.reg); err != nil {
		return err
	}
	if s.router, err = NewRouter(cfg.Router, s.view, s.log.Named("router"), s.reg); err != nil {
		s.view.Close()
		return err
	}
	return nil
}

// listen opens the picker's listeners: public HTTP, admin, and the
// optional gRPC decision service and endpoint picker (whose service is
// registered here).
func (s *Server) listen(cfg *ServerConfig, tf *tlsFiles) error {
	var err error
	if s.httpLn, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("--listen %s: %w", cfg.Listen, err)
	}
	if s.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		return fmt.Errorf("--admin-listen %s: %w", cfg.AdminListen, err)
	}
	if cfg.GRPCListen != "" {
		if s.grpcLn, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
			return fmt.Errorf("--grpc-listen %s: %w", cfg.GRPCListen, err)
		}
	}
	if cfg.ExtProcListen != "" {
		opts := ExtProcServerOptions(cfg.Router.MaxBodyBytes, s.log)
		if tf.extProc != nil {
			opts = append(opts, grpc.Creds(tf.extProc))
		}
		s.epp = grpc.NewServer(opts...)
		if err := s.router.RegisterExtProc(s.epp, cfg.ExtProc, s.ready); err != nil {
			return err
		}
		if s.eppLn, err = net.Listen("tcp", cfg.ExtProcListen); err != nil {
			return fmt.Errorf("--ext-proc-listen %s: %w", cfg.ExtProcListen, err)
		}
	}
	return nil
}

// serve starts serving on every listener opened.
func (s *Server) serve(cfg *ServerConfig, tf *tlsFiles) {
	opts := HandlerOptions{Token: s.decisionToken, Ready: s.ready, GossipInsecure: s.members.Insecure, Pickers: s.share.debug,
		Metrics: promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg})}
	if s.eppLn != nil {
		opts.ExtProc = &debugapi.ExtProc{Address: s.eppLn.Addr().String(), TLS: cfg.ExtProcTLSCert != "", ClientCert: cfg.ExtProcClientCA != ""}
	}
	// A client gets a minute to send its request, and an idle connection
	// two; answers (streams) are not bounded: the client's leaving ends them.
	s.http = &http.Server{Handler: s.router.Handler(opts), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	s.admin = &http.Server{Handler: s.router.AdminHandler(opts), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	for _, srv := range []struct {
		name string
		http *http.Server
		ln   net.Listener
	}{{"http server", s.http, s.httpLn}, {"admin server", s.admin, s.adminLn}} {
		go func() {
			if err := srv.http.Serve(srv.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error(srv.name, zap.Error(err))
			}
		}()
	}
	if s.grpcLn != nil {
		s.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(int(cfg.Router.MaxBodyBytes)+4096),
			grpc.ChainUnaryInterceptor(recoverUnary(s.log)), grpc.ChainStreamInterceptor(recoverStream(s.log)), tf.grpcCreds())
		s.router.registerGRPC(s.grpc, s.decisionToken)
		go func() { _ = s.grpc.Serve(s.grpcLn) }()
	}
	if s.eppLn != nil {
		go func() { _ = s.epp.Serve(s.eppLn) }()
	}
}

// decisionToken is the decision API's token now ("" none).
func (s *Server) decisionToken() string { return *s.token.Load() }

// Addr is the public HTTP address (OpenAI endpoints, decision API).
func (s *Server) Addr() string { return s.httpLn.Addr().String() }

// AdminAddr is the admin HTTP address (/healthz, /readyz, /metrics,
// /debug/*).
func (s *Server) AdminAddr() string { return s.adminLn.Addr().String() }

// GRPCAddr is the gRPC address ("" when disabled).
func (s *Server) GRPCAddr() string {
	if s.grpcLn == nil {
		return ""
	}
	return s.grpcLn.Addr().String()
}

// ExtProcAddr is the endpoint picker's address ("" when disabled).
func (s *Server) ExtProcAddr() string {
	if s.eppLn == nil {
		return ""
	}
	return s.eppLn.Addr().String()
}

// Members is the gossip membership (nil without gossip).
func (s *Server) Members() *gossip.Members { return s.members }

// Router is the routing core.
func (s *Server) Router() *Router { return s.router }

// View is the fleet view.
func (s *Server) View() *fleetview.View { return s.view }

// ready is the picker's readiness besides knowing a routable endpoint:
// not while draining, nor with a gossip name conflict.
func (s *Server) ready() error {
	if r := s.drain.Load(); r != nil {
		return fmt.Errorf("draining (%s): the picker is shutting down", *r)
	}
	return s.members.Conflict()
}

// Drain starts a graceful shutdown: from now on /readyz (and the endpoint
// picker's gRPC readiness) fail with reason, while every request is still
// served, for ServerConfig.DrainDelay or until ctx ends (a second signal),
// so that load balancers stop sending first. Call Close after it: Close
// stops accepting and lets requests in flight finish, up to
// ServerConfig.ShutdownTimeout. A second call only waits.
func (s *Server) Drain(ctx context.Context, reason string) {
	if reason == "" {
		reason = "draining"
	}
	if s.drain.CompareAndSwap(nil, &reason) {
		s.draining.Set(1)
		s.log.Info("draining: /readyz fails; serving on for the drain delay, then requests in flight finish",
			zap.String("reason", reason), zap.Duration("drain_delay", s.cfg.DrainDelay), zap.Duration("shutdown_timeout", s.cfg.ShutdownTimeout))
	}
	if s.cfg.DrainDelay <= 0 {
		return
	}
	t := time.NewTimer(s.cfg.DrainDelay)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// stopGRPC stops g gracefully, cutting what is still in flight after
// timeout.
func stopGRPC(g *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		g.Stop()
		<-done
	}
}

// Close stops accepting, lets requests in flight finish (up to
// ServerConfig.ShutdownTimeout; 5 s for a server started without one),
// and leaves the gossip; it is idempotent.
func (s *Server) Close() {
	if s.cancel != nil {
		s.cancel()
	}
	timeout := s.cfg.ShutdownTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if s.router != nil {
		// Requests still waiting for room are answered 503 now, so their
		// clients can send them to another replica.
		s.router.admit.close()
	}
	s.share.close() // its streams end, so the server's graceful stop need not wait for them
	if s.peerSrv != nil {
		stopGRPC(s.peerSrv, time.Second)
	} else if s.peerLn != nil {
		_ = s.peerLn.Close()
	}
	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		if err := s.http.Shutdown(ctx); err != nil {
			s.log.Warn("requests still in flight at the shutdown timeout were cut", zap.Duration("shutdown_timeout", timeout))
			_ = s.http.Close()
		}
		cancel()
	} else if s.httpLn != nil {
		_ = s.httpLn.Close()
	}
	if s.grpc != nil {
		stopGRPC(s.grpc, timeout)
	} else if s.grpcLn != nil {
		_ = s.grpcLn.Close()
	}
	if s.epp != nil {
		stopGRPC(s.epp, timeout)
	}
	if s.eppLn != nil {
		_ = s.eppLn.Close() // also when Serve never started
	}
	// The admin port answers (/readyz failing, /metrics) until the
	// public one has stopped.
	if s.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if s.admin.Shutdown(ctx) != nil {
			_ = s.admin.Close()
		}
		cancel()
	} else if s.adminLn != nil {
		_ = s.adminLn.Close()
	}
	if s.members != nil {
		_ = s.members.Close() // leaves, then shuts down
	}
	if s.view != nil {
		s.view.Close()
	}
	if s.router != nil {
		s.router.Close()
	}
}

// recoverUnary turns a panic in a call into an Internal error (logged)
// instead of the end of the process.
func recoverUnary(log *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				log.Error("panic in a gRPC call", zap.String("method", info.FullMethod), zap.Any("panic", p))
				err = status.Errorf(codes.Internal, "internal error")
			}
		}()
		return handler(ctx, req)
	}
}

// recoverStream is recoverUnary for streams.
func recoverStream(log *zap.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				log.Error("panic in a gRPC stream", zap.String("method", info.FullMethod), zap.Any("panic", p))
				err = status.Errorf(codes.Internal, "internal error")
			}
		}()
		return handler(srv, ss)
	}
}
