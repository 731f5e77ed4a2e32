package gossip

import (
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// logged is a member started with an observed logger and its own registry.
type logged struct {
	*Members
	logs *observer.ObservedLogs
	reg  *prometheus.Registry
}

func startLogged(t *testing.T, cfg Config, meta Meta) logged {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	reg := prometheus.NewRegistry()
	m, err := New(cfg, meta, zap.New(core), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Kill() })
	return logged{m, logs, reg}
}

// metric returns the value of the series of family name whose labels
// include want, or -1 when there is none (so that a missing series fails
// a comparison with 0).
func metric(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if metrictest.Series(fams, name, want) == 0 {
		return -1
	}
	return metrictest.Sum(fams, name, want)
}

// errorLines counts the error-level entries whose message contains sub.
func errorLines(logs *observer.ObservedLogs, sub string) int {
	n := 0
	for _, e := range logs.All() {
		if e.Level == zapcore.ErrorLevel && strings.Contains(e.Message, sub) {
			n++
		}
	}
	return n
}

func (l logged) notices() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, cf := range l.conflicts {
		n += cf.notices
	}
	return n
}

// TestSameHostDefaultNames: two sidecars and a picker started the way
// `kvroute sidecar` and `kvroute picker` start them with no --node-name
// (DefaultConfig: one start port, the same seed for all) on one host form
// one cluster: each takes the next free port, names itself after the host,
// its role and that port, and sees the other two; no conflict anywhere.
func TestSameHostDefaultNames(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	port := testnet.FreePortRun(t, 3)
	seed := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var ms []logged
	for i, role := range []string{RoleSidecar, RoleSidecar, RolePicker} {
		cfg := DefaultConfig()
		cfg.BindAddr, cfg.BindPort, cfg.Join = "127.0.0.1", port, []string{seed}
		meta := Meta{Role: role}
		if role == RoleSidecar {
			meta = sidecarMeta(fmt.Sprint("s", i), 0)
		}
		m := startLogged(t, cfg, meta)
		if want := fmt.Sprintf("%s-%s-%d", host, role, port+i); m.Name() != want || m.LocalAddr() != net.JoinHostPort("127.0.0.1", strconv.Itoa(port+i)) {
			t.Fatalf("member %d: name %q at %s, want %q at port %d", i, m.Name(), m.LocalAddr(), want, port+i)
		}
		if got := metric(t, m.reg, "kvroute_gossip_node_info", map[string]string{"name": m.Name(), "addr": m.LocalAddr()}); got != 1 {
			t.Fatalf("kvroute_gossip_node_info for %s: %v", m.Name(), got)
		}
		ms = append(ms, m)
	}
	want := strings.Join([]string{ms[2].Name(), ms[0].Name(), ms[1].Name()}, ",") // sorted: picker < sidecar
	for _, m := range ms {
		testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
			if got := memberNames(m.Members); got != want {
				return fmt.Errorf("%s sees %s, want all three: %s", m.Name(), got, want)
			}
			return nil
		})
	}
	for _, m := range ms {
		if err := m.Conflict(); err != nil {
			t.Errorf("%s: %v", m.Name(), err)
		}
		if n := errorLines(m.logs, ""); n != 0 {
			t.Errorf("%s logged %d errors: %v", m.Name(), n, m.logs.FilterLevelExact(zapcore.ErrorLevel).All())
		}
		for _, kind := range []string{kindSelf, kindOthers} {
			if c, g := metric(t, m.reg, "kvroute_gossip_name_conflicts_total", map[string]string{"kind": kind}),
				metric(t, m.reg, "kvroute_gossip_name_conflict", map[string]string{"kind": kind}); c != 0 || g != 0 {
				t.Errorf("%s: %s conflicts %v, gauge %v", m.Name(), kind, c, g)
			}
		}
	}
}

// TestBindPorts: a taken port is skipped only within BindPorts; with an
// advertised port the name carries that port.
func TestBindPorts(t *testing.T) {
	port := testnet.FreePortPair(t)
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := DefaultConfig()
	cfg.NodeName, cfg.BindAddr, cfg.BindPort, cfg.BindPorts = "n-{role}-{port}", "127.0.0.1", port, 1
	if _, err := New(cfg, Meta{Role: RolePicker}, nil, nil); err == nil || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Fatalf("bind to a taken port with BindPorts 1: %v", err)
	}
	cfg.BindPorts = 2
	m := startLogged(t, cfg, Meta{Role: RolePicker})
	if want := fmt.Sprintf("n-picker-%d", port+1); m.Name() != want {
		t.Fatalf("name %q, want %q", m.Name(), want)
	}
	if m.logs.FilterMessageSnippet("bound the next free one").Len() != 1 {
		t.Fatalf("the fall-back was not logged: %v", m.logs.All())
	}
	m.Kill()
	cfg.BindPorts, cfg.AdvertiseAddr, cfg.AdvertisePort = 1, "127.0.0.1", 7999
	cfg.BindPort = port + 1
	a := startLogged(t, cfg, Meta{Role: RoleSidecar})
	if a.Name() != "n-sidecar-7999" || a.LocalAddr() != "127.0.0.1:7999" {
		t.Fatalf("advertised: name %q at %s", a.Name(), a.LocalAddr())
	}
}

// TestNameConflict: two members given one name over real UDP/TCP on
// loopback. Each reports it once at error level however often gossip
// repeats it (memberlist's own per-message line is at debug), counts it,
// holds the gauge at 1 and answers Conflict with the other's address; once
// the other is gone the conflict resolves.
func TestNameConflict(t *testing.T) {
	a := startLogged(t, LocalConfig("twin"), Meta{Role: RolePicker})
	cfg := LocalConfig("twin")
	cfg.Join = []string{a.LocalAddr()}
	b := startLogged(t, cfg, sidecarMeta("twin", 0))
	for _, m := range []logged{a, b} {
		testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
			if n := m.notices(); n < 3 {
				return fmt.Errorf("%s: %d notices of the conflict, want 3", m.LocalAddr(), n)
			}
			return nil
		})
	}
	for _, p := range [][2]logged{{a, b}, {b, a}} {
		m, other := p[0], p[1]
		err := m.Conflict()
		if err == nil || !strings.Contains(err.Error(), other.LocalAddr()) || !strings.Contains(err.Error(), `"twin"`) {
			t.Fatalf("%s: Conflict() = %v", m.LocalAddr(), err)
		}
		if n := errorLines(m.logs, "gossip name conflict"); n != 1 {
			t.Fatalf("%s: %d error lines for one conflict seen %d times", m.LocalAddr(), n, m.notices())
		}
		if n := m.logs.FilterMessageSnippet("Conflicting address").FilterLevelExact(zapcore.DebugLevel).Len(); n == 0 {
			t.Errorf("%s: memberlist's conflict line is not at debug", m.LocalAddr())
		}
		if n := errorLines(m.logs, ""); n != 1 {
			t.Errorf("%s: %d error lines: %v", m.LocalAddr(), n, m.logs.FilterLevelExact(zapcore.ErrorLevel).All())
		}
		if c, g := metric(t, m.reg, "kvroute_gossip_name_conflicts_total", map[string]string{"kind": kindSelf}),
			metric(t, m.reg, "kvroute_gossip_name_conflict", map[string]string{"kind": kindSelf}); c != 1 || g != 1 {
			t.Fatalf("%s: conflicts_total %v, gauge %v", m.LocalAddr(), c, g)
		}
		if len(m.Members.Members()) != 1 {
			t.Fatalf("%s sees %s", m.LocalAddr(), memberNames(m.Members))
		}
	}
	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		if err := a.Conflict(); err != nil {
			return fmt.Errorf("the conflict did not resolve: %w", err)
		}
		return nil
	})
	if g := metric(t, a.reg, "kvroute_gossip_name_conflict", map[string]string{"kind": kindSelf}); g != 0 {
		t.Fatalf("gauge %v after the conflict resolved", g)
	}
	if a.logs.FilterMessage("gossip name conflict resolved").Len() != 1 {
		t.Fatal("the resolution was not logged once")
	}
	var nilMembers *Members
	if nilMembers.Conflict() != nil {
		t.Fatal("a nil Members reports a conflict")
	}
}

// TestNameConflictObserved: two sidecars with one name join a picker. The
// picker reports the clash between others (error line, kind "others") but
// stays ready (its own name is fine); the sidecar refused reports it as
// its own conflict.
func TestNameConflictObserved(t *testing.T) {
	p := startLogged(t, LocalConfig("picker"), Meta{Role: RolePicker})
	var twins []logged
	for i := 0; i < 2; i++ {
		cfg := LocalConfig("twin")
		cfg.Join = []string{p.LocalAddr()}
		twins = append(twins, startLogged(t, cfg, sidecarMeta("twin", 0)))
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if g := metric(t, p.reg, "kvroute_gossip_name_conflict", map[string]string{"kind": kindOthers}); g != 1 {
			return fmt.Errorf("the picker's others-conflict gauge is %v, want 1", g)
		}
		return nil
	})
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if twins[1].Conflict() == nil {
			return errors.New("the refused twin sees no conflict")
		}
		return nil
	})
	if err := p.Conflict(); err != nil {
		t.Fatalf("the picker's own name is not in conflict: %v", err)
	}
	if n := errorLines(p.logs, "two members claim one name"); n != 1 {
		t.Fatalf("picker: %d error lines", n)
	}
	if c := metric(t, p.reg, "kvroute_gossip_name_conflicts_total", map[string]string{"kind": kindOthers}); c != 1 {
		t.Fatalf("picker: others conflicts_total %v", c)
	}
	if got := memberNames(p.Members); got != "picker,twin" {
		t.Fatalf("picker sees %s", got)
	}
	if err := twins[1].Kill(); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		if g := metric(t, p.reg, "kvroute_gossip_name_conflict", map[string]string{"kind": kindOthers}); g != 0 {
			return fmt.Errorf("the observed conflict did not resolve: gauge %v", g)
		}
		return nil
	})
}

// TestMemberlistLogLevels: memberlist's lines, as its standard logger
// writes them, reach zap at the level their tag names, without the tag.
func TestMemberlistLogLevels(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := stdlog.New(memberlistLogger(zap.New(core)), "", 0)
	cases := []struct {
		line  string
		level zapcore.Level
		msg   string
	}{
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:4242", zapcore.DebugLevel, "Stream connection from=127.0.0.1:4242"},
		{"[INFO] memberlist: Suspect node-a has failed, no acks received", zapcore.InfoLevel, "Suspect node-a has failed, no acks received"},
		{"[WARN] memberlist: Was able to connect to node-b over TCP but UDP probes failed", zapcore.WarnLevel, "Was able to connect to node-b over TCP but UDP probes failed"},
		{"[ERR] memberlist: Failed to send ping: write: connection refused", zapcore.ErrorLevel, "Failed to send ping: write: connection refused"},
		{"[ERROR] memberlist: Failed to push local state", zapcore.ErrorLevel, "Failed to push local state"},
		{"[ERR] memberlist: Conflicting address for twin. Mine: 127.0.0.1:1 Theirs: 127.0.0.1:2 Old state: 0", zapcore.DebugLevel,
			"Conflicting address for twin. Mine: 127.0.0.1:1 Theirs: 127.0.0.1:2 Old state: 0"},
		{"memberlist: untagged", zapcore.InfoLevel, "untagged"},
		{"[NOTICE] odd", zapcore.InfoLevel, "[NOTICE] odd"},
	}
	for _, c := range cases {
		l.Print(c.line)
	}
	got := logs.AllUntimed()
	if len(got) != len(cases) {
		t.Fatalf("%d entries for %d lines", len(got), len(cases))
	}
	for i, c := range cases {
		if got[i].Level != c.level || got[i].Message != c.msg || got[i].LoggerName != "memberlist" {
			t.Errorf("%q: got %s %q (logger %q), want %s %q", c.line, got[i].Level, got[i].Message, got[i].LoggerName, c.level, c.msg)
		}
	}
	// A logger at warn keeps memberlist's debug and info lines out.
	core, logs = observer.New(zapcore.WarnLevel)
	l = stdlog.New(memberlistLogger(zap.New(core)), "", 0)
	for _, c := range cases {
		l.Print(c.line)
	}
	if n := logs.Len(); n != 3 {
		t.Fatalf("%d entries at warn and above, want 3", n)
	}
}

// TestConfigNamesAndPorts: the defaults are valid and name a member after
// its host, role and port; the port settings that cannot work are refused.
func TestConfigNamesAndPorts(t *testing.T) {
	d := DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	host, _ := os.Hostname()
	if got := nodeName(d.NodeName, RoleSidecar, 7947); got != host+"-sidecar-7947" {
		t.Fatalf("default name %q", got)
	}
	if got := nodeName("pod-a", RolePicker, 7946); got != "pod-a" {
		t.Fatalf("a name without placeholders changed: %q", got)
	}
	for name, mod := range map[string]func(*Config){
		"no ports":               func(c *Config) { c.BindPorts = 0 },
		"past 65535":             func(c *Config) { c.BindPort = 65530 },
		"advertised port, range": func(c *Config) { c.AdvertisePort = 7946 },
		"empty name":             func(c *Config) { c.NodeName = "" },
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: valid", name)
		}
	}
	c := DefaultConfig()
	c.AdvertisePort, c.BindPorts = 7946, 1
	if err := c.Validate(); err != nil {
		t.Fatalf("advertised port with one bind port: %v", err)
	}
}
