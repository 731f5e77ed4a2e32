package gossip

// Issue 21: gossip convergence at fleet scale. BenchmarkGossipScale starts
// N sidecars and one picker through New with the commands' defaults
// (DefaultConfig: memberlist's LAN timings) and measures, per cluster:
//
//   - join: from launching the first member until the picker sees all N
//     sidecars with their gRPC address (what it needs to route), and until
//     every member sees all N+1 alive;
//   - idle bandwidth: bytes sent per member per second (packets and
//     streams) in a window after the join traffic settled;
//   - meta: one sidecar's SetMeta (an epoch bump) until the picker, and
//     every member, hold the new metadata;
//   - detect: one sidecar killed (no leave) until the picker, and every
//     member, dropped it;
//   - churn bandwidth: bytes per member per second while every sidecar
//     republishes its digests every 5 s, as a sidecar with moving seqs does.
//
// Two transports: "mock" is memberlist's in-memory MockNetwork (no sockets,
// no kernel: what the protocol itself costs), wrapped so a killed member's
// packets are dropped instead of blocking the sender (MockTransport's
// channels are unbuffered) and so bytes can be counted; "udp" is
// memberlist's NetTransport on 127.0.0.1 (real UDP and TCP), wrapped the
// same way for counting. Run one cluster per iteration:
//
//	go test ./gossip/ -run '^$' -bench 'GossipScale/mock/N=1000$' -benchtime 1x -count 3 -timeout 60m

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/test/testnet"
)

// scaleNet is one benchmark cluster's network: the mock network (nil for
// UDP) and every transport by address.
type scaleNet struct {
	mock  *memberlist.MockNetwork
	mu    sync.RWMutex
	byAdr map[string]*scaleTransport
	done  chan struct{} // closed at teardown: the mock drains stop
}

// scaleTransport wraps a memberlist transport: it counts the bytes this
// member sends (packets and both directions' stream writes it makes), and
// once shut down it drains the inner transport (a mock sender would block
// forever on a dead member) and refuses streams, as a dead host would.
type scaleTransport struct {
	inner   memberlist.Transport
	net     *scaleNet
	addr    string
	sent    atomic.Int64
	dropped atomic.Int64 // packets lost to a full receive queue
	closed  atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	stop    chan struct{}
	once    sync.Once
}

func newScaleTransport(n *scaleNet, inner memberlist.Transport) (*scaleTransport, error) {
	ip, port, err := inner.FinalAdvertiseAddr("", 0)
	if err != nil {
		return nil, err
	}
	t := &scaleTransport{inner: inner, net: n, addr: net.JoinHostPort(ip.String(), strconv.Itoa(port)),
		packets: make(chan *memberlist.Packet, 512), streams: make(chan net.Conn), stop: make(chan struct{})}
	n.mu.Lock()
	n.byAdr[t.addr] = t
	n.mu.Unlock()
	done := n.done
	if n.mock == nil {
		done = t.stop // NetTransport stops delivering once shut
	}
	go func() {
		for {
			select {
			case pk := <-inner.PacketCh():
				if t.closed.Load() {
					continue
				}
				select {
				case t.packets <- pk:
				default: // a full socket buffer: UDP loses it
					t.dropped.Add(1)
				}
			case c := <-inner.StreamCh():
				if t.closed.Load() {
					c.Close()
					continue
				}
				select {
				case t.streams <- &countConn{Conn: c, n: &t.sent}:
				case <-t.stop:
					c.Close()
				}
			case <-done:
				return
			}
		}
	}()
	return t, nil
}

func (t *scaleTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

// dead reports whether addr is a member of the mock network shut down.
func (t *scaleTransport) dead(addr string) bool {
	if t.net.mock == nil {
		return false
	}
	t.net.mu.RLock()
	d := t.net.byAdr[addr]
	t.net.mu.RUnlock()
	return d != nil && d.closed.Load()
}

func (t *scaleTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.closed.Load() {
		return time.Time{}, errors.New("transport shut down")
	}
	t.sent.Add(int64(len(b)))
	if t.dead(addr) {
		return time.Now(), nil // UDP to a dead host: sent, never answered
	}
	return t.inner.WriteTo(b, addr)
}

func (t *scaleTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *scaleTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.closed.Load() || t.dead(addr) {
		return nil, fmt.Errorf("dial %s: connection refused", addr)
	}
	c, err := t.inner.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return &countConn{Conn: c, n: &t.sent}, nil
}

func (t *scaleTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *scaleTransport) Shutdown() error {
	t.closed.Store(true)
	t.once.Do(func() { close(t.stop) })
	return t.inner.Shutdown()
}

// countConn counts the bytes written to a stream.
type countConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// scaleCluster is N sidecars and one picker.
type scaleCluster struct {
	net      *scaleNet
	trs      []*scaleTransport
	members  []*Members // index pickerAt is the picker; the rest sidecars
	names    []string
	pickerAt int
	n        int        // sidecars
	mu       sync.Mutex // members and names while starting
}

const scaleSeeds = 3

func (c *scaleCluster) picker() *Members { return c.members[c.pickerAt] }

func (c *scaleCluster) sidecarMeta(i int, epoch, seq uint64) Meta {
	return Meta{Role: RoleSidecar, GRPC: fmt.Sprintf("10.%d.%d.%d:9090", i>>16&255, i>>8&255, i&255), Group: "0123456789abcdef",
		Endpoints: []Digest{{Endpoint: fmt.Sprintf("tcp://10.%d.%d.%d:5557", i>>16&255, i>>8&255, i&255), Epoch: epoch, Seq: seq}}}
}

// newScaleCluster makes the transports (the mock network's maps are not
// safe for concurrent use, so every mock transport exists before any
// member starts).
func newScaleCluster(b *testing.B, kind string, n int) *scaleCluster {
	c := &scaleCluster{net: &scaleNet{byAdr: map[string]*scaleTransport{}, done: make(chan struct{})}, n: n, pickerAt: scaleSeeds}
	if kind == "mock" {
		c.net.mock = &memberlist.MockNetwork{}
	}
	for i := 0; i <= n; i++ {
		var inner memberlist.Transport
		if kind == "mock" {
			inner = c.net.mock.NewTransport(fmt.Sprintf("t%d", i))
		} else {
			var err error
			for try := 0; try < 10; try++ { // port 0: the UDP twin of a free TCP port may be taken
				if inner, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, BindPort: 0}); err == nil {
					break
				}
			}
			if err != nil {
				c.close()
				b.Fatalf("member %d: %v", i, err)
			}
		}
		tr, err := newScaleTransport(c.net, inner)
		if err != nil {
			c.close()
			b.Fatal(err)
		}
		c.trs = append(c.trs, tr)
	}
	c.members = make([]*Members, n+1)
	c.names = make([]string, n+1)
	return c
}

// start launches every member as a fleet rollout would: the seeds first
// (each joining those before it), then the picker and the sidecars,
// `parallel` at a time, each joining the seeds (what a headless Service of
// the first pods resolves to). Each sidecar then publishes its gRPC
// address with SetMeta, as Sidecar.startGossip does after New.
func (c *scaleCluster) start(parallel int) error {
	var pub sync.WaitGroup
	defer pub.Wait()
	seeds := make([]string, scaleSeeds)
	for i := range seeds {
		seeds[i] = c.trs[i].addr
	}
	one := func(i int) error {
		cfg := DefaultConfig()
		cfg.Transport = c.trs[i]
		if i < scaleSeeds {
			cfg.Join = append([]string(nil), seeds[:i]...)
		} else {
			cfg.Join = seeds
		}
		role := RoleSidecar
		if i == c.pickerAt {
			role = RolePicker
		}
		m, err := New(cfg, Meta{Role: role}, zap.NewNop(), nil)
		if err != nil {
			return fmt.Errorf("member %d: %w", i, err)
		}
		c.mu.Lock()
		c.members[i], c.names[i] = m, m.Name()
		c.mu.Unlock()
		if role == RoleSidecar {
			// Not waited for: SetMeta blocks until its broadcast went out
			// (up to 1 s), which each pod of a fleet waits on by itself.
			pub.Add(1)
			go func() { defer pub.Done(); _ = m.SetMeta(c.sidecarMeta(i, 1, 0)) }()
		}
		return nil
	}
	for i := 0; i < scaleSeeds; i++ {
		if err := one(i); err != nil {
			return err
		}
	}
	next := make(chan int)
	errs := make(chan error, parallel)
	var wg sync.WaitGroup
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := one(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := scaleSeeds; i <= c.n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// view calls f with member i's view (others only) under its lock; false
// before the member started.
func (c *scaleCluster) view(i int, f func(map[string]Member)) bool {
	c.mu.Lock()
	m := c.members[i]
	c.mu.Unlock()
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m.view)
	return true
}

// until polls every 20 ms, from t0 for up to limit: pickerOK is asked of the
// picker, memberOK of each member not yet done (a member counts once it
// first satisfied it). It returns when each was first true for the picker
// and for the last member, or an error at the deadline.
func (c *scaleCluster) until(t0 time.Time, limit time.Duration, skip map[int]bool, pickerOK func(map[string]Member) bool,
	memberOK func(i int, v map[string]Member) bool) (picker, all time.Duration, err error) {
	pending := map[int]bool{}
	for i := range c.members {
		if !skip[i] {
			pending[i] = true
		}
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	picker, all = -1, -1
	for {
		now := time.Since(t0)
		if picker < 0 {
			var ok bool
			if c.view(c.pickerAt, func(v map[string]Member) { ok = pickerOK(v) }) && ok {
				picker = now
			}
		}
		for i := range pending {
			var ok bool
			if c.view(i, func(v map[string]Member) { ok = memberOK(i, v) }) && ok {
				delete(pending, i)
			}
		}
		if len(pending) == 0 && all < 0 {
			all = now
		}
		if picker >= 0 && all >= 0 {
			return picker, all, nil
		}
		if now > limit {
			var some []int
			for i := range pending {
				if len(some) < 5 {
					some = append(some, i)
				}
			}
			return picker, all, fmt.Errorf("after %v: picker done %v, %d members pending (%v)", limit, picker >= 0, len(pending), some)
		}
		<-tick.C
	}
}

func (c *scaleCluster) bytesSent() (sent, dropped int64) {
	for _, t := range c.trs {
		sent += t.sent.Load()
		dropped += t.dropped.Load()
	}
	return sent, dropped
}

func (c *scaleCluster) close() {
	var wg sync.WaitGroup
	for _, m := range c.members {
		if m != nil {
			wg.Add(1)
			go func() { defer wg.Done(); _ = m.Kill() }()
		}
	}
	wg.Wait()
	for _, t := range c.trs {
		_ = t.Shutdown() // those memberlist never took
	}
	close(c.net.done)
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// window measures bytes per member per second and CPU cores over d.
func (c *scaleCluster) window(d time.Duration, members int) (bps, cores float64, dropped int64) {
	s0, d0 := c.bytesSent()
	c0, t0 := cpuTime(), time.Now()
	time.Sleep(d) // a measurement window, not a synchronisation
	s1, d1 := c.bytesSent()
	wall := time.Since(t0)
	return float64(s1-s0) / wall.Seconds() / float64(members), float64(cpuTime()-c0) / float64(wall), d1 - d0
}

// awaitQuiet polls the fleet's outbound bytes a second at a time until a
// second's are within 10% of the second's before (the join's broadcasts
// spent: what is left is the steady probing and push-pull), at most 60
// seconds; past that the idle figures are taken as they are, logged.
func (c *scaleCluster) awaitQuiet(b *testing.B) {
	prev, _ := c.bytesSent()
	var last int64 = -1
	for range 60 {
		time.Sleep(time.Second) // one sample's interval
		now, _ := c.bytesSent()
		d := now - prev
		prev = now
		if last >= 0 && math.Abs(float64(d-last)) <= 0.1*float64(last) {
			return
		}
		last = d
	}
	b.Logf("outbound bytes not steady within 60 s")
}

func BenchmarkGossipScale(b *testing.B) {
	for _, kind := range []string{"mock", "udp"} {
		for _, n := range []int{100, 250, 500, 1000} {
			b.Run(fmt.Sprintf("%s/N=%d", kind, n), func(b *testing.B) {
				for it := 0; it < b.N; it++ {
					runScale(b, kind, n)
				}
			})
		}
	}
}

func runScale(b *testing.B, kind string, n int) {
	c := newScaleCluster(b, kind, n)
	defer c.close()
	sidecars := func(v map[string]Member) bool {
		k := 0
		for _, m := range v {
			if m.Meta.Role == RoleSidecar && m.Meta.GRPC != "" {
				k++
			}
		}
		return k == n
	}
	// n others: N+1 alive (the view may hold the member itself once it
	// updated its own metadata; Members skips it).
	everyone := func(i int, v map[string]Member) bool {
		k := len(v)
		if _, self := v[c.names[i]]; self {
			k--
		}
		return k == n
	}

	// Join.
	cpu0, t0 := cpuTime(), time.Now()
	startErr := make(chan error, 1)
	var started time.Duration
	go func() { err := c.start(32); started = time.Since(t0); startErr <- err }()
	pj, aj, err := c.until(t0, 3*time.Minute, nil, sidecars, everyone)
	if err != nil {
		b.Logf("join: %v", err) // reported as -1; the later phases still run
	}
	if err := <-startErr; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(started.Seconds(), "started-s") // every New and SetMeta returned
	joinCores := float64(cpuTime()-cpu0) / float64(time.Since(t0))
	joinBytes, _ := c.bytesSent()
	b.ReportMetric(pj.Seconds(), "join-picker-s")
	b.ReportMetric(aj.Seconds(), "join-all-s")
	b.ReportMetric(float64(joinBytes)/float64(n+1), "join-B/member")
	b.ReportMetric(joinCores, "join-cores")

	// Idle bandwidth, once the join broadcasts are spent.
	c.awaitQuiet(b)
	bps, cores, drops := c.window(10*time.Second, n+1)
	b.ReportMetric(bps, "idle-B/s/member")
	b.ReportMetric(cores, "idle-cores")

	// A metadata change: sidecar n-1 bumps its epoch.
	mi := n
	mname := c.names[mi]
	newEpoch := func(v map[string]Member) bool {
		m, ok := v[mname]
		return ok && len(m.Meta.Endpoints) == 1 && m.Meta.Endpoints[0].Epoch == 2
	}
	t0 = time.Now()
	_ = c.members[mi].SetMeta(c.sidecarMeta(mi, 2, 0))
	pm, am, err := c.until(t0, 2*time.Minute, map[int]bool{mi: true}, newEpoch, func(_ int, v map[string]Member) bool { return newEpoch(v) })
	if err != nil {
		b.Logf("meta: %v", err)
	}
	b.ReportMetric(pm.Seconds(), "meta-picker-s")
	b.ReportMetric(am.Seconds(), "meta-all-s")

	// Failure: sidecar n/2 dies without leaving.
	vi := n / 2
	vname := c.names[vi]
	gone := func(v map[string]Member) bool { _, ok := v[vname]; return !ok }
	t0 = time.Now()
	if err := c.members[vi].Kill(); err != nil {
		b.Fatal(err)
	}
	pd, ad, err := c.until(t0, 3*time.Minute, map[int]bool{vi: true}, gone, func(_ int, v map[string]Member) bool { return gone(v) })
	if err != nil {
		b.Logf("detect: %v", err)
	}
	b.ReportMetric(pd.Seconds(), "detect-picker-s")
	b.ReportMetric(ad.Seconds(), "detect-all-s")

	// Churn: every sidecar republishes its digests every 5 s.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var publishing atomic.Int64 // sidecars past their first republish
	churners := 0
	for i, m := range c.members {
		if i == c.pickerAt || i == vi {
			continue
		}
		churners++
		wg.Add(1)
		go func() {
			defer wg.Done()
			phase := time.Duration(i) * 5 * time.Second / time.Duration(n+1)
			select {
			case <-time.After(phase):
			case <-stop:
				return
			}
			tick := time.NewTicker(5 * time.Second)
			defer tick.Stop()
			for seq := uint64(1); ; seq++ {
				_ = m.SetMeta(c.sidecarMeta(i, 1+boolU(i == mi), seq))
				if seq == 1 {
					publishing.Add(1)
				}
				select {
				case <-tick.C:
				case <-stop:
					return
				}
			}
		}()
	}
	testnet.Await(b, time.Minute, 10*time.Millisecond, func() error {
		if n := publishing.Load(); n < int64(churners) {
			return fmt.Errorf("%d of %d sidecars republishing", n, churners)
		}
		return nil
	})
	cbps, ccores, cdrops := c.window(10*time.Second, n)
	close(stop)
	wg.Wait()
	b.ReportMetric(cbps, "churn-B/s/member")
	b.ReportMetric(ccores, "churn-cores")
	b.ReportMetric(float64(drops+cdrops), "drops")
}

func boolU(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
