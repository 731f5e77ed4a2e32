package gossip

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip/secretfile"
)

// Config configures membership. Start from DefaultConfig (or LocalConfig
// for loopback): a zero field is invalid, not a default, and Validate says
// which. AdvertiseAddr/AdvertisePort, Join, KeyFile and Transport are
// optional: empty means "not set", as documented on each.
type Config struct {
	// NodeName must be unique in the cluster. "{role}" and "{port}" in it
	// are replaced, once the port is bound, by the member's role (sidecar,
	// picker) and its gossip port (the advertised one when set, else the
	// one bound), so processes sharing a host get distinct names. Default
	// "<host name>-{role}-{port}", e.g. "gpu-3-sidecar-7946".
	NodeName string
	// BindAddr and BindPort are where gossip listens (UDP and TCP).
	// Default 127.0.0.1:7946 (processes sharing a host); port 0 picks a
	// free one. An address off loopback needs KeyFile (or Insecure).
	BindAddr string
	BindPort int
	// BindPorts is how many ports, from BindPort up, are tried in turn
	// until one is free, so processes sharing a host each find one: 1 is
	// BindPort exactly. Default 16 (7946–7961); 1 in LocalConfig. With an
	// AdvertisePort (others dial that port) it must be 1.
	BindPorts int
	// AdvertiseAddr/AdvertisePort are what others dial; default: the bind
	// address (or the first private address when binding 0.0.0.0) and the
	// port bound.
	AdvertiseAddr string
	AdvertisePort int
	// Join lists host:port entries or DNS names resolving to several
	// addresses (a headless Service); a name without a port uses BindPort.
	Join []string
	// KeyFile holds the gossip keyring: one base64 key (16, 24 or 32
	// bytes) a line, the first primary. Empty: no encryption, which is
	// refused for a bind address off loopback unless Insecure.
	KeyFile string
	// KeyPoll is how often KeyFile is checked for a change, which is
	// applied as ReloadKeys applies it (a Kubernetes Secret updated in
	// place rotates the keys without a SIGHUP). Default secretfile.Poll
	// (2 s); must be positive when KeyFile is set.
	KeyPoll time.Duration
	// Secrets, when set, counts the keyring's reloads
	// (kvroute_<subsystem>_secret_reloads_total{secret="gossip_key"}): the
	// process's own secret-file metrics. Nil: not counted.
	Secrets *secretfile.Metrics
	// Insecure allows gossip without a keyring on an address off
	// loopback (--gossip-insecure): anyone who reaches the port is then a
	// member and may advertise endpoints. Logged as a warning at start
	// and exported (kvroute_gossip_insecure).
	Insecure bool
	// Local selects loopback timings (tests, a laptop); default LAN.
	Local bool
	// Transport replaces the network (tests); nil uses UDP/TCP.
	Transport memberlist.Transport
	// EventBuffer is how many events may wait for the consumer. Default 1024.
	EventBuffer int
	// Rejoin: this often, Join seeds that are not members are contacted
	// again, so a partition heals by itself (memberlist alone never probes
	// members it declared dead), and the claimant of a name conflict is
	// contacted to see whether the conflict lasts. Default 10 s; 1 s in
	// LocalConfig. Must be positive.
	Rejoin time.Duration
}

// DefaultConfig returns LAN defaults.
func DefaultConfig() Config {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "kvroute"
	}
	return Config{NodeName: host + "-{role}-{port}", BindAddr: "127.0.0.1", BindPort: 7946, BindPorts: 16,
		EventBuffer: 1024, Rejoin: 10 * time.Second, KeyPoll: secretfile.Poll}
}

// LocalConfig returns loopback defaults with fast failure detection.
func LocalConfig(name string) Config {
	return Config{NodeName: name, BindAddr: "127.0.0.1", BindPort: 0, BindPorts: 1, Local: true, EventBuffer: 1024, Rejoin: time.Second, KeyPoll: secretfile.Poll}
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("gossip: empty node name"))
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		errs = append(errs, fmt.Errorf("--gossip-bind/--gossip-advertise: port out of range"))
	}
	switch {
	case c.BindPorts < 1:
		errs = append(errs, fmt.Errorf("--gossip-ports %d: want at least 1", c.BindPorts))
	case c.BindPort > 0 && c.BindPort+c.BindPorts-1 > 65535:
		errs = append(errs, fmt.Errorf("--gossip-ports %d: ports from %d on run past 65535", c.BindPorts, c.BindPort))
	case c.BindPorts > 1 && c.AdvertisePort != 0:
		errs = append(errs, fmt.Errorf("--gossip-ports %d with --gossip-advertise port %d: others dial the advertised port, so the bind port cannot move (want 1)", c.BindPorts, c.AdvertisePort))
	}
	if c.Transport == nil && net.ParseIP(c.BindAddr) == nil {
		errs = append(errs, fmt.Errorf("--gossip-bind %q: want an IP address", c.BindAddr))
	} else if c.unencryptedOffLoopback() && !c.Insecure {
		errs = append(errs, fmt.Errorf("--gossip-bind %s is off loopback, and gossip without a keyring lets anyone who reaches the port join and advertise endpoints: give --gossip-key-file (one base64 key a line; make one with: openssl rand -base64 32), or --gossip-insecure to run it unencrypted anyway", c.BindAddr))
	}
	if c.Rejoin <= 0 {
		errs = append(errs, fmt.Errorf("gossip: rejoin interval %v: want a positive interval", c.Rejoin))
	}
	if c.KeyFile != "" && c.KeyPoll <= 0 {
		errs = append(errs, fmt.Errorf("gossip: key file check interval %v: want a positive interval", c.KeyPoll))
	}
	if c.EventBuffer < 1 {
		errs = append(errs, fmt.Errorf("gossip: event buffer %d", c.EventBuffer))
	}
	return errors.Join(errs...)
}

// unencryptedOffLoopback reports whether c gossips over the network
// (not a test transport) on an address off loopback without a keyring.
func (c *Config) unencryptedOffLoopback() bool {
	ip := net.ParseIP(c.BindAddr)
	return c.Transport == nil && c.KeyFile == "" && ip != nil && !ip.IsLoopback()
}

// nodeName resolves name's {role} and {port}.
func nodeName(name, role string, port int) string {
	return strings.NewReplacer("{role}", role, "{port}", strconv.Itoa(port)).Replace(name)
}

// EventType says what happened to a member.
type EventType int

// Event types.
const (
	Join EventType = iota + 1
	Leave
	Update
)

func (t EventType) String() string {
	return map[EventType]string{Join: "join", Leave: "leave", Update: "update"}[t]
}

// Member is one node as last heard.
type Member struct {
	Name    string
	Addr    string // gossip address host:port
	Meta    Meta
	MetaErr error // set when the node's metadata did not decode
}

// Event is a membership change.
type Event struct {
	Type   EventType
	Member Member
}

// Members is this node's view of the cluster.
type Members struct {
	cfg      Config
	insecure bool // no keyring off loopback (Config.Insecure)
	log      *zap.Logger
	ml       *memberlist.Memberlist
	keyring  *memberlist.Keyring
	keys     *secretfile.File[[][]byte] // KeyFile, re-read when it changes
	stopKeys context.CancelFunc         // ends the key file's watch
	events   chan Event
	name     string // cfg.NodeName resolved

	mu   sync.Mutex
	meta []byte
	// view is the membership as told by memberlist's events, copied while
	// memberlist holds its lock (its *Node values are not safe to read later).
	view map[string]Member
	self Member
	// failed holds the addresses of members that left or died, which the
	// rejoin loop keeps trying for a while, as Serf's reconnector does:
	// memberlist alone never probes a member it declared dead, so a healed
	// partition would otherwise stay split.
	failed map[string]time.Time
	// conflicts are the name conflicts held, by name and claimant address.
	conflicts map[conflictKey]*conflict

	stop chan struct{}
	once sync.Once
	shut atomic.Bool

	dropped, received prometheus.Counter
	size              prometheus.GaugeFunc
	conflictsSeen     *prometheus.CounterVec
	inConflict        *prometheus.GaugeVec
}

// New starts membership with meta as this node's metadata and joins
// cfg.Join (when given). reg receives the gossip metrics.
func New(cfg Config, meta Meta, log *zap.Logger, reg prometheus.Registerer) (*Members, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	enc, err := meta.Encode()
	if err != nil {
		return nil, err
	}
	m := &Members{cfg: cfg, log: log, events: make(chan Event, cfg.EventBuffer), meta: enc, stop: make(chan struct{}),
		view: map[string]Member{}, failed: map[string]time.Time{}, conflicts: map[conflictKey]*conflict{}}
	mc := memberlist.DefaultLANConfig()
	if cfg.Local {
		// Loopback: probe often so a dead member is gone within ~1–3 s.
		mc = memberlist.DefaultLocalConfig()
		mc.ProbeInterval, mc.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
		mc.SuspicionMult, mc.GossipInterval = 2, 50*time.Millisecond
	}
	// A member restarted under the same name at a new address (a pod
	// rescheduled) is taken back once its old self has been dead this long.
	mc.DeadNodeReclaimTime = 30 * time.Second
	mc.Delegate = (*delegate)(m)
	mc.Events = (*events)(m)
	mc.Conflict = (*conflicts)(m)
	mc.Logger = stdlog.New(memberlistLogger(log), "", 0)
	if cfg.KeyFile != "" {
		if m.keys, err = secretfile.Open(keyFileSpec(cfg.KeyFile, m.installKeys), cfg.Secrets, log.Named("keys")); err != nil {
			return nil, err
		}
		mc.Keyring = m.keyring
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	insecure := cfg.unencryptedOffLoopback()
	m.insecure = insecure
	if insecure {
		log.Warn("gossip is unencrypted off loopback (--gossip-insecure): anyone who reaches the port can join and advertise endpoints; give --gossip-key-file",
			zap.String("bind", cfg.BindAddr))
	}
	if reg != nil {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_gossip_insecure",
			Help: "1 when gossip runs without a keyring on an address off loopback (--gossip-insecure), else 0."})
		if insecure {
			g.Set(1)
		}
		reg.MustRegister(g)
		m.dropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_gossip_events_dropped_total", Help: "Membership events lost because the consumer fell behind."})
		m.received = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_gossip_events_total", Help: "Membership events (join, leave, update)."})
		m.conflictsSeen = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_gossip_name_conflicts_total",
			Help: "Gossip name conflicts detected (each counted once, however often gossip repeats it): kind self, another member claims this node's name; others, two other members claim one name."}, []string{"kind"})
		m.inConflict = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvroute_gossip_name_conflict",
			Help: "1 while a gossip name conflict of this kind is held (self also fails /readyz), else 0."}, []string{"kind"})
		for _, k := range []string{kindSelf, kindOthers} {
			m.conflictsSeen.WithLabelValues(k)
			m.inConflict.WithLabelValues(k).Set(0)
		}
		reg.MustRegister(m.dropped, m.received, m.conflictsSeen, m.inConflict)
	}
	// Bind first, so the name can carry the port.
	port := cfg.AdvertisePort
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	if cfg.Transport != nil {
		mc.Transport = cfg.Transport
		if _, p, err := cfg.Transport.FinalAdvertiseAddr(cfg.AdvertiseAddr, cfg.AdvertisePort); err == nil && port == 0 {
			port = p
		}
		mc.BindAddr, mc.BindPort, mc.AdvertisePort = cfg.BindAddr, cfg.BindPort, port
	} else {
		nt, err := bind(cfg, mc.Logger)
		if err != nil {
			return nil, err
		}
		bound := nt.GetAutoBindPort()
		if port == 0 {
			port = bound
		}
		if cfg.BindPort != 0 && bound != cfg.BindPort {
			log.Info("gossip port in use; bound the next free one", zap.Int("port", cfg.BindPort), zap.Int("bound", bound))
		}
		mc.Transport, mc.BindAddr, mc.BindPort, mc.AdvertisePort = nt, cfg.BindAddr, bound, port
		defer func() {
			if m.ml == nil {
				_ = nt.Shutdown() // memberlist never took it
			}
		}()
	}
	m.name = nodeName(cfg.NodeName, meta.Role, port)
	mc.Name = m.name
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	m.ml = ml
	m.mu.Lock()
	m.self = member(m.ml.LocalNode())
	m.self.Meta, m.self.MetaErr = meta, nil
	delete(m.view, m.self.Name) // the join of ourselves, if already reported
	self := m.self
	m.mu.Unlock()
	if reg != nil {
		m.size = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvroute_gossip_members", Help: "Members alive in this node's view."},
			func() float64 { return float64(m.ml.NumMembers()) })
		info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_gossip_node_info", Help: "This node's gossip name and address (always 1).",
			ConstLabels: prometheus.Labels{"name": self.Name, "addr": self.Addr}})
		info.Set(1)
		reg.MustRegister(m.size, info)
	}
	log.Info("gossip member", zap.String("name", self.Name), zap.String("addr", self.Addr))
	if len(cfg.Join) > 0 {
		if _, err := m.Join(cfg.Join...); err != nil {
			log.Warn("gossip join failed; will retry", zap.Error(err))
		}
	}
	go m.rejoinLoop()
	if m.keys != nil {
		var ctx context.Context
		ctx, m.stopKeys = context.WithCancel(context.Background())
		go secretfile.Watch(ctx, cfg.KeyPoll, m.keys)
	}
	return m, nil
}

// bind opens the UDP/TCP transport on the first free port of BindPort …
// BindPort+BindPorts-1. Port 0 lets the kernel choose, and is retried as
// memberlist does: its TCP port's UDP twin may be taken.
func bind(cfg Config, logger *stdlog.Logger) (*memberlist.NetTransport, error) {
	tries, step := cfg.BindPorts, 1
	if cfg.BindPort == 0 {
		tries, step = 10, 0
	}
	var err error
	for i := 0; i < tries; i++ {
		nc := &memberlist.NetTransportConfig{BindAddrs: []string{cfg.BindAddr}, BindPort: cfg.BindPort + i*step, Logger: logger}
		var nt *memberlist.NetTransport
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			return nt, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if cfg.BindPorts > 1 && cfg.BindPort != 0 {
		return nil, fmt.Errorf("--gossip-bind %s: ports %d to %d: %w", cfg.BindAddr, cfg.BindPort, cfg.BindPort+cfg.BindPorts-1, err)
	}
	return nil, fmt.Errorf("--gossip-bind %s: %w", net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.BindPort)), err)
}

// Insecure reports whether gossip runs without a keyring on an address
// off loopback (Config.Insecure).
func (m *Members) Insecure() bool { return m != nil && m.insecure }

// Name is this node's gossip name (NodeName with {role} and {port} resolved).
func (m *Members) Name() string { return m.name }

// reconnectFor bounds how long a dead member's address is retried.
const reconnectFor = 10 * time.Minute

// rejoinLoop contacts seeds that are not (or no longer) members, and
// members that were declared dead.
func (m *Members) rejoinLoop() {
	t := time.NewTicker(m.cfg.Rejoin)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		alive := map[string]bool{}
		for _, mb := range m.Members() {
			alive[mb.Addr] = true
		}
		var missing []string
		m.mu.Lock()
		for addr, since := range m.failed {
			if alive[addr] || time.Since(since) > reconnectFor {
				delete(m.failed, addr)
				continue
			}
			missing = append(missing, addr)
		}
		m.mu.Unlock()
		for _, seed := range m.cfg.Join {
			addrs, err := resolve(seed, m.cfg.BindPort)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if !alive[a] && a != m.LocalAddr() {
					missing = append(missing, a)
				}
			}
		}
		if len(missing) > 0 {
			// A seed named by another address than the one its member
			// advertises (127.0.0.1 for 10.0.0.5) is contacted every round:
			// only a join that brought members back is worth a line.
			before := m.ml.NumMembers()
			if n, err := m.ml.Join(missing); err == nil && n > 0 && m.ml.NumMembers() > before {
				m.log.Info("gossip rejoined", zap.Strings("seeds", missing))
			}
		}
		m.recheckConflicts()
	}
}

// stopLoops stops the rejoin loop without waiting for a Join in progress
// (memberlist's Join cannot be cancelled; it fails once memberlist is shut).
func (m *Members) stopLoops() {
	m.once.Do(func() {
		close(m.stop)
		if m.stopKeys != nil {
			m.stopKeys()
		}
	})
}

// Join contacts the given members (host:port or DNS names) and returns
// how many answered.
func (m *Members) Join(peers ...string) (int, error) {
	var addrs []string
	for _, p := range peers {
		resolved, err := resolve(p, m.cfg.BindPort)
		if err != nil {
			m.log.Warn("gossip join address", zap.String("peer", p), zap.Error(err))
			continue
		}
		addrs = append(addrs, resolved...)
	}
	if len(addrs) == 0 {
		return 0, fmt.Errorf("gossip: no join address resolved from %v", peers)
	}
	return m.ml.Join(addrs)
}

// resolve expands a DNS name to every address it has.
func resolve(peer string, defaultPort int) ([]string, error) {
	host, port, err := net.SplitHostPort(peer)
	if err != nil {
		host, port = peer, strconv.Itoa(defaultPort)
	}
	if net.ParseIP(host) != nil {
		return []string{net.JoinHostPort(host, port)}, nil
	}
	ips, err := net.LookupHost(host)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, net.JoinHostPort(ip, port))
	}
	return out, nil
}

// Events delivers membership changes.
func (m *Members) Events() <-chan Event { return m.events }

// Members returns every member alive in this node's view, itself included,
// sorted by name.
func (m *Members) Members() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []Member{m.self}
	for name, mb := range m.view {
		if name != m.self.Name {
			out = append(out, mb)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// LocalAddr returns this node's gossip address.
func (m *Members) LocalAddr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.self.Addr
}

// ErrShutdown is returned after Close or Kill.
var ErrShutdown = errors.New("gossip: membership shut down")

// SetMeta replaces this node's metadata and gossips it.
func (m *Members) SetMeta(meta Meta) error {
	if m.shut.Load() {
		return ErrShutdown
	}
	enc, err := meta.Encode()
	if err != nil {
		return err
	}
	m.mu.Lock()
	same := bytes.Equal(enc, m.meta)
	m.meta = enc
	m.self.Meta = meta
	m.mu.Unlock()
	if same {
		return nil
	}
	return m.ml.UpdateNode(time.Second)
}

// ReloadKeys re-reads the key file now (SIGHUP): keys it lists are
// installed, its first becomes primary, keys it no longer lists are
// removed. The file is also checked every KeyPoll, and a change applied
// the same way, so a rotation needs no signal.
func (m *Members) ReloadKeys() error {
	if m.keys == nil {
		return errors.New("gossip: encryption is off (no key file)")
	}
	return m.keys.Reload()
}

// keyFileSpec reads the keyring file: one base64 key a line, blank lines
// and # comments skipped, the first primary; never quoted in an error.
func keyFileSpec(path string, install func([][]byte)) secretfile.Spec[[][]byte] {
	return secretfile.Spec[[][]byte]{Name: "gossip_key", Flags: []string{"--gossip-key-file"}, Paths: []string{path},
		Parse:    func(c [][]byte) ([][]byte, error) { return parseKeys(c[0]) },
		Describe: func(keys [][]byte) []zap.Field { return []zap.Field{zap.Int("keys", len(keys))} },
		Install:  install}
}

// installKeys applies a keyring read from the key file: the first makes
// the keyring (at New); later ones add the keys listed, make the first
// primary, and remove the keys no longer listed.
func (m *Members) installKeys(keys [][]byte) {
	if m.keyring == nil {
		// parseKeys checked the sizes, the keyring's only refusal.
		m.keyring, _ = memberlist.NewKeyring(keys, keys[0])
		return
	}
	var errs []error
	for _, k := range keys {
		errs = append(errs, m.keyring.AddKey(k))
	}
	errs = append(errs, m.keyring.UseKey(keys[0]))
	for _, old := range m.keyring.GetKeys() {
		listed := false
		for _, k := range keys {
			listed = listed || bytes.Equal(k, old)
		}
		if !listed {
			errs = append(errs, m.keyring.RemoveKey(old))
		}
	}
	if err := errors.Join(errs...); err != nil {
		m.log.Error("applying the gossip keyring", zap.Error(err))
	}
}

// parseKeys parses one base64 key a line (blank lines and # comments
// skipped), each of 16, 24 or 32 bytes.
func parseKeys(data []byte) ([][]byte, error) {
	var keys [][]byte
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil || (len(k) != 16 && len(k) != 24 && len(k) != 32) {
			return nil, fmt.Errorf("line %d: want a base64 key of 16, 24 or 32 bytes", i+1)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no keys")
	}
	return keys, nil
}

// Close leaves the cluster politely (bounded) and stops. Closing twice,
// or after Kill, does nothing.
func (m *Members) Close() error {
	m.stopLoops()
	if m.shut.Swap(true) {
		return nil
	}
	_ = m.ml.Leave(2 * time.Second)
	return m.ml.Shutdown()
}

// Kill stops without leaving: to others this node fails (tests).
func (m *Members) Kill() error {
	m.stopLoops()
	if m.shut.Swap(true) {
		return nil
	}
	return m.ml.Shutdown()
}

func member(n *memberlist.Node) Member {
	mb := Member{Name: n.Name, Addr: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))}
	mb.Meta, mb.MetaErr = DecodeMeta(n.Meta)
	return mb
}

// delegate serves memberlist's Delegate: metadata only.
type delegate Members

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.meta) > limit {
		return nil
	}
	return append([]byte(nil), d.meta...)
}
func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// events serves memberlist's EventDelegate without ever blocking it.
type events Members

func (e *events) send(t EventType, n *memberlist.Node) {
	ev := Event{Type: t, Member: member(n)} // copied now, under memberlist's lock
	e.mu.Lock()
	if t == Leave {
		delete(e.view, ev.Member.Name)
		if n.State == memberlist.StateDead {
			e.failed[ev.Member.Addr] = time.Now() // failed, not left: worth retrying
		}
	} else {
		e.view[ev.Member.Name] = ev.Member
		delete(e.failed, ev.Member.Addr)
	}
	e.mu.Unlock()
	if e.received != nil {
		e.received.Inc()
	}
	select {
	case e.events <- ev:
	default:
		if e.dropped != nil {
			e.dropped.Inc()
		}
	}
}

func (e *events) NotifyJoin(n *memberlist.Node)   { e.send(Join, n) }
func (e *events) NotifyLeave(n *memberlist.Node)  { e.send(Leave, n) }
func (e *events) NotifyUpdate(n *memberlist.Node) { e.send(Update, n) }
