package p2p_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/test/enginesim/p2p"
	"github.com/kvroute/kvroute/test/enginesim/p2p/p2ptest"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// tier is a fake CPU tier: the set of digests it holds.
type tier struct {
	mu   sync.Mutex
	held map[blockkey.Digest]bool
	// gate, when set, holds every lookup until it is closed or ctx ends;
	// entered, when set (buffered), is told of a lookup held when it has
	// room.
	gate    chan struct{}
	entered chan struct{}
}

func newTier(hs ...blockkey.Digest) *tier {
	t := &tier{held: map[blockkey.Digest]bool{}}
	for _, h := range hs {
		t.held[h] = true
	}
	return t
}

func (t *tier) lookup(ctx context.Context, hs []blockkey.Digest) (int, error) {
	if t.gate != nil {
		select { // buffered: the test hears of the first lookup held
		case t.entered <- struct{}{}:
		default:
		}
		select {
		case <-t.gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for n < len(hs) && t.held[hs[n]] {
		n++
	}
	return n, nil
}

func (t *tier) evict(h blockkey.Digest) {
	t.mu.Lock()
	delete(t.held, h)
	t.mu.Unlock()
}

// digests are n distinct block digests, from seed.
func digests(seed string, n int) []blockkey.Digest {
	out := make([]blockkey.Digest, n)
	for i := range out {
		out[i] = sha256.Sum256([]byte(seed + strconv.Itoa(i)))
	}
	return out
}

func fingerprint() p2p.Fingerprint {
	return p2p.Fingerprint{BlockSize: 16, HashSeed: "vllm-none-hash", HashAlgo: "sha256_cbor", Model: "m"}
}

func config() p2p.Config {
	c := p2p.DefaultConfig()
	c.Host = "127.0.0.1"
	c.Port = 0
	c.Fingerprint = fingerprint()
	c.HandshakeTimeout = 2 * time.Second
	c.PullTimeout = 5 * time.Second
	return c
}

// node starts a node answering from tr; its registry is returned for the
// metrics.
func node(t *testing.T, cfg p2p.Config, tr *tier) (*p2p.Node, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	n, err := p2p.New(cfg, tr.lookup, zaptest.NewLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n, reg
}

func noHold(int, int, int, bool) time.Duration { return 0 }

func pull(t *testing.T, n *p2p.Node, peer string, hs []blockkey.Digest, hold p2p.HoldFunc) (p2p.PullResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.Pull(ctx, peer, "req-1", hs, hold)
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	return metrictest.Gathered(t, reg, name, labels)
}

// TestPullRoundTrip: a consumer finds the source's leading hits, fetches
// them, and learns the source's pulls under way; the pair's first fetch
// is First, later ones are not.
func TestPullRoundTrip(t *testing.T) {
	hs := digests("a", 8)
	src, srcReg := node(t, config(), newTier(hs[:5]...))
	dst, dstReg := node(t, config(), newTier())

	var seen []int
	hold := func(hits, srcActive, dstActive int, first bool) time.Duration {
		seen = append(seen, hits, srcActive, dstActive)
		return time.Minute // capped at the pull timeout by the source
	}
	res, err := pull(t, dst, src.ID(), hs, hold)
	if err != nil {
		t.Fatal(err)
	}
	if want := (p2p.PullResult{Hits: 5, Blocks: 5, First: true}); res != want {
		t.Fatalf("first pull: %+v, want %+v", res, want)
	}
	res, err = pull(t, dst, src.ID(), hs, hold)
	if err != nil {
		t.Fatal(err)
	}
	// The first pull is still under way on both ends.
	if want := (p2p.PullResult{Hits: 5, Blocks: 5, SrcActive: 1, DstActive: 1}); res != want {
		t.Fatalf("second pull: %+v, want %+v", res, want)
	}
	if fmt.Sprint(seen) != "[5 0 0 5 1 1]" {
		t.Errorf("hold saw %v", seen)
	}
	for _, c := range []struct {
		reg  *prometheus.Registry
		name string
		l    map[string]string
		want float64
	}{
		{srcReg, "kvroute_engine_p2p_served_total", map[string]string{"op": "lookup"}, 2},
		{srcReg, "kvroute_engine_p2p_served_total", map[string]string{"op": "fetch"}, 2},
		{srcReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "inbound", "outcome": "ready"}, 1},
		{dstReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "outbound", "outcome": "ready"}, 1},
		{dstReg, "kvroute_engine_p2p_sessions", nil, 1},
	} {
		if got := counter(t, c.reg, c.name, c.l); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.l, got, c.want)
		}
	}
}

// TestMissNeedsNoFetch: a source holding none of the prefix answers 0 hits
// and nothing is fetched.
func TestMissNeedsNoFetch(t *testing.T) {
	hs := digests("b", 4)
	src, srcReg := node(t, config(), newTier(hs[1:]...)) // not the first block: no leading hit
	dst, _ := node(t, config(), newTier())
	res, err := pull(t, dst, src.ID(), hs, func(int, int, int, bool) time.Duration {
		t.Error("hold asked for a miss")
		return 0
	})
	if err != nil || res != (p2p.PullResult{}) {
		t.Fatalf("%+v, %v: want an empty result", res, err)
	}
	if got := counter(t, srcReg, "kvroute_engine_p2p_served_total", map[string]string{"op": "fetch"}); got != 0 {
		t.Errorf("%v fetches served", got)
	}
}

// TestEvictedBeforeFetch: a block evicted between the lookup and the fetch
// is a miss: the fetch moves the blocks before it only.
func TestEvictedBeforeFetch(t *testing.T) {
	hs := digests("c", 6)
	tr := newTier(hs...)
	src, _ := node(t, config(), tr)
	dst, _ := node(t, config(), newTier())
	res, err := pull(t, dst, src.ID(), hs, func(int, int, int, bool) time.Duration {
		tr.evict(hs[3]) // between the lookup and the fetch
		return 0
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Hits != 6 || res.Blocks != 3 {
		t.Fatalf("%+v: want 6 hits at the lookup, 3 blocks fetched", res)
	}
}

// TestLongPrefixSplit: a prefix over MaxHashes goes in several messages,
// and the hits add up; a short message ends the probe.
func TestLongPrefixSplit(t *testing.T) {
	cfg := config()
	cfg.MaxHashes = 4
	cfg.MaxFrameBytes = 8192
	hs := digests("d", 11)
	src, srcReg := node(t, cfg, newTier(hs[:9]...))
	dst, _ := node(t, cfg, newTier())
	res, err := pull(t, dst, src.ID(), hs, noHold)
	if err != nil {
		t.Fatal(err)
	}
	if res.Hits != 9 || res.Blocks != 9 {
		t.Fatalf("%+v: want 9 hits and blocks", res)
	}
	// lookups of 4, 4, 3 (the last short: 1 hit); fetches of 4, 4, 1.
	if got := counter(t, srcReg, "kvroute_engine_p2p_served_total", map[string]string{"op": "lookup"}); got != 3 {
		t.Errorf("%v lookups, want 3", got)
	}
	if got := counter(t, srcReg, "kvroute_engine_p2p_served_total", map[string]string{"op": "fetch"}); got != 3 {
		t.Errorf("%v fetches, want 3", got)
	}
}

// TestConnectionReusedBothWays: once one side pulled, the other pulls over
// the same connection, and it is no longer the pair's first fetch.
func TestConnectionReusedBothWays(t *testing.T) {
	ha, hb := digests("ea", 3), digests("eb", 3)
	a, aReg := node(t, config(), newTier(ha...))
	b, bReg := node(t, config(), newTier(hb...))
	if res, err := pull(t, b, a.ID(), ha, noHold); err != nil || !res.First {
		t.Fatalf("b from a: %+v, %v", res, err)
	}
	res, err := pull(t, a, b.ID(), hb, noHold)
	if err != nil || res.Blocks != 3 || res.First {
		t.Fatalf("a from b: %+v, %v: want 3 blocks over the warmed connection", res, err)
	}
	for _, reg := range []*prometheus.Registry{aReg, bReg} {
		if got := counter(t, reg, "kvroute_engine_p2p_connections_total", nil); got != 1 {
			t.Errorf("%v connections, want the one", got)
		}
	}
}

// TestFingerprintMismatchRejected: peers that disagree on the offload
// block, the seed, the algorithm or the model never serve each other; the
// pull fails as rejected, on both sides' counters.
func TestFingerprintMismatchRejected(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*p2p.Fingerprint)
	}{
		{"block size", func(f *p2p.Fingerprint) { f.BlockSize = 32 }},
		{"hash seed", func(f *p2p.Fingerprint) { f.HashSeed = "42" }},
		{"hash algo", func(f *p2p.Fingerprint) { f.HashAlgo = "xxhash" }},
		{"model", func(f *p2p.Fingerprint) { f.Model = "other" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			hs := digests("f", 2)
			srcCfg := config()
			c.edit(&srcCfg.Fingerprint)
			src, srcReg := node(t, srcCfg, newTier(hs...))
			dst, dstReg := node(t, config(), newTier())
			_, err := pull(t, dst, src.ID(), hs, noHold)
			if p2p.Reason(err) != "rejected" {
				t.Fatalf("pull: %v, want rejected", err)
			}
			if got := counter(t, srcReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "inbound", "outcome": "rejected"}); got != 1 {
				t.Errorf("source: %v inbound rejections", got)
			}
			if got := counter(t, dstReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "outbound", "outcome": "rejected"}); got != 1 {
				t.Errorf("consumer: %v outbound rejections", got)
			}
			if got := counter(t, srcReg, "kvroute_engine_p2p_served_total", nil); got != 0 {
				t.Errorf("source served %v messages", got)
			}
		})
	}
}

// TestUnreachablePeerFailsFast: nothing listens: the pull fails as
// unreachable (the caller recomputes), not as a timeout — it does not wait
// out the pull timeout, which would fail it as one — and is counted.
func TestUnreachablePeerFailsFast(t *testing.T) {
	dst, dstReg := node(t, config(), newTier())
	peer := net.JoinHostPort("127.0.0.1", strconv.Itoa(testnet.FreePort(t)))
	_, err := pull(t, dst, peer, digests("g", 2), noHold)
	if p2p.Reason(err) != "unreachable" {
		t.Fatalf("pull: %v, want unreachable", err)
	}
	if got := counter(t, dstReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "outbound", "outcome": "failed"}); got != 1 {
		t.Errorf("%v failed connections", got)
	}
	if _, err := pull(t, dst, "no-port", digests("g", 1), noHold); p2p.Reason(err) != "unreachable" {
		t.Errorf("a peer without a port: %v", err)
	}
}

// TestHandshakeTimeout: a peer that accepts and never answers is dead
// after the handshake timeout: the pull fails as a handshake failure, not
// as the pull's own timeout (5 s, far past the handshake's 200 ms), which
// it would be if the handshake were not bounded.
func TestHandshakeTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c // silent
		}
	}()
	t.Cleanup(func() {
		select {
		case c := <-held:
			_ = c.Close()
		default:
		}
	})
	cfg := config()
	cfg.HandshakeTimeout = 200 * time.Millisecond
	dst, _ := node(t, cfg, newTier())
	_, err = pull(t, dst, ln.Addr().String(), digests("h", 1), noHold)
	if p2p.Reason(err) != "handshake" {
		t.Fatalf("pull: %v, want handshake", err)
	}
}

// TestSilentInboundDropped: a connection to the node that never sends its
// connect is closed by the node once the handshake timeout passes (the
// client's own deadline, 5 s, bounds the wait), counted as failed.
func TestSilentInboundDropped(t *testing.T) {
	cfg := config()
	cfg.HandshakeTimeout = 200 * time.Millisecond
	src, srcReg := node(t, cfg, newTier())
	closedByPeer(t, raw(t, src))
	testnet.Await(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := counter(t, srcReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "inbound", "outcome": "failed"}); got != 1 {
			return fmt.Errorf("%v failed inbound connections", got)
		}
		return nil
	})
}

// raw dials n and returns the connection.
func raw(t *testing.T, n *p2p.Node) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", n.ID(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	return c
}

func lengthPrefixed(body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

// closedByPeer reads until the node closes c; frames before the close (a
// disconnect, a connect_ack) are skipped.
func closedByPeer(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the connection was not closed: %v", err)
	}
}

// hello is a valid connect from a peer named id.
func hello(id string) []byte {
	return lengthPrefixed(`{"type":"connect","version":1,"id":"` + id + `","fingerprint":{"block_size":16,"hash_seed":"vllm-none-hash","hash_algo":"sha256_cbor","model":"m"}}`)
}

// TestHostileFrames: oversized, garbage and out-of-place frames close the
// connection, are counted by reason, and the node serves on.
func TestHostileFrames(t *testing.T) {
	hs := digests("i", 2)
	src, srcReg := node(t, config(), newTier(hs...))
	for i, c := range []struct {
		name   string
		send   func(hello []byte) [][]byte // hello: a connect, its id unique to the case
		reason string
	}{
		{"oversized at the handshake", func([]byte) [][]byte { return [][]byte{{0xff, 0xff, 0xff, 0xff}} }, "oversized"},
		{"garbage at the handshake", func([]byte) [][]byte { return [][]byte{lengthPrefixed("not json")} }, "malformed"},
		{"disconnect in place of connect", func([]byte) [][]byte {
			return [][]byte{lengthPrefixed(`{"type":"disconnect","version":1,"id":"x:1"}`)}
		}, "malformed"},
		{"lookup before the handshake", func([]byte) [][]byte {
			return [][]byte{lengthPrefixed(`{"type":"lookup","hashes":"` + strings.Repeat("A", 44) + `"}`)}
		}, "malformed"},
		{"oversized after", func(h []byte) [][]byte { return [][]byte{h, {0x7f, 0, 0, 0}} }, "oversized"},
		{"hashes not whole digests", func(h []byte) [][]byte {
			return [][]byte{h, lengthPrefixed(`{"type":"lookup","seq":1,"hashes":"AAAA"}`)}
		}, "malformed"},
		{"negative count", func(h []byte) [][]byte {
			return [][]byte{h, lengthPrefixed(`{"type":"lookup_resp","seq":1,"hits":-1}`)}
		}, "malformed"},
		{"unknown type", func(h []byte) [][]byte { return [][]byte{h, lengthPrefixed(`{"type":"steal"}`)} }, "malformed"},
		{"connect twice", func(h []byte) [][]byte { return [][]byte{h, h} }, "unexpected"},
		{"empty frame", func(h []byte) [][]byte { return [][]byte{h, {0, 0, 0, 0}} }, "malformed"},
		{"an answer to nothing, then garbage", func(h []byte) [][]byte {
			return [][]byte{h, lengthPrefixed(`{"type":"lookup_resp","seq":99,"hits":1}`), lengthPrefixed("{")}
		}, "malformed"},
	} {
		h := hello("peer-" + strconv.Itoa(i) + ":1")
		t.Run(c.name, func(t *testing.T) {
			before := counter(t, srcReg, "kvroute_engine_p2p_frames_rejected_total", map[string]string{"reason": c.reason})
			conn := raw(t, src)
			for _, b := range c.send(h) {
				if _, err := conn.Write(b); err != nil {
					t.Fatal(err)
				}
			}
			closedByPeer(t, conn)
			testnet.Await(t, 5*time.Second, 5*time.Millisecond, func() error {
				if got := counter(t, srcReg, "kvroute_engine_p2p_frames_rejected_total", map[string]string{"reason": c.reason}); got != before+1 {
					return fmt.Errorf("%v %s rejections, want %v", got, c.reason, before+1)
				}
				return nil
			})
		})
	}
	dst, _ := node(t, config(), newTier())
	if res, err := pull(t, dst, src.ID(), hs, noHold); err != nil || res.Blocks != 2 {
		t.Fatalf("after the hostile peers: %+v, %v", res, err)
	}
}

// TestDuplicateConnectionRejected: a second connection claiming a peer's
// identity while its first is open is refused.
func TestDuplicateConnectionRejected(t *testing.T) {
	src, srcReg := node(t, config(), newTier())
	id := "peer:1"
	first := raw(t, src)
	if _, err := first.Write(hello(id)); err != nil {
		t.Fatal(err)
	}
	var head [4]byte
	if _, err := io.ReadFull(first, head[:]); err != nil { // the connect_ack
		t.Fatal(err)
	}
	second := raw(t, src)
	if _, err := second.Write(hello(id)); err != nil {
		t.Fatal(err)
	}
	closedByPeer(t, second)
	if got := counter(t, srcReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "inbound", "outcome": "rejected"}); got != 1 {
		t.Errorf("%v rejections", got)
	}
}

// TestConcurrentConsumers: several consumers pull from one source at once,
// each many times over its one connection; every answer is right.
func TestConcurrentConsumers(t *testing.T) {
	hs := digests("j", 16)
	src, srcReg := node(t, config(), newTier(hs[:10]...))
	const consumers, each = 4, 16
	var wg sync.WaitGroup
	errs := make(chan error, consumers*each)
	for i := 0; i < consumers; i++ {
		dst, _ := node(t, config(), newTier())
		for j := 0; j < each; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				res, err := dst.Pull(ctx, src.ID(), fmt.Sprintf("r%d-%d", i, j), hs[:j+1], noHold)
				if want := min(j+1, 10); err != nil || res.Blocks != want {
					errs <- fmt.Errorf("consumer %d pull %d: %+v, %v, want %d blocks", i, j, res, err, want)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := counter(t, srcReg, "kvroute_engine_p2p_connections_total", map[string]string{"outcome": "ready"}); got != consumers {
		t.Errorf("%v connections, want one per consumer", got)
	}
	if got := counter(t, srcReg, "kvroute_engine_p2p_served_total", map[string]string{"op": "lookup"}); got != consumers*each {
		t.Errorf("%v lookups served", got)
	}
}

// TestCloseWhilePulling: closing the source during a pull fails the pull
// (peer down) and both nodes close; no goroutine is left behind.
func TestCloseWhilePulling(t *testing.T) {
	before := runtime.NumGoroutine()
	hs := digests("k", 3)
	tr := newTier(hs...)
	tr.gate = make(chan struct{}) // lookups hang until the source closes
	reg := prometheus.NewRegistry()
	src, err := p2p.New(config(), tr.lookup, zaptest.NewLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := p2p.New(config(), newTier().lookup, zaptest.NewLogger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := dst.Pull(context.Background(), src.ID(), "r", hs, noHold)
		done <- err
	}()
	testnet.Await(t, 5*time.Second, 5*time.Millisecond, func() error {
		if counter(t, reg, "kvroute_engine_p2p_sessions", nil) != 1 {
			return errors.New("not connected yet")
		}
		return nil
	})
	src.Close()
	select {
	case err := <-done:
		if r := p2p.Reason(err); r != "peer_down" {
			t.Errorf("pull: %v, want peer_down", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pull did not end when its source closed")
	}
	dst.Close()
	if _, err := dst.Pull(context.Background(), src.ID(), "r", hs, noHold); p2p.Reason(err) != "closed" {
		t.Errorf("pull on a closed node: %v", err)
	}
	testnet.Await(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := runtime.NumGoroutine(); n > before {
			return fmt.Errorf("%d goroutines, %d before", n, before)
		}
		return nil
	})
}

// TestConfigValidate: the bounds are checked.
func TestConfigValidate(t *testing.T) {
	if err := config().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, edit := range []func(*p2p.Config){
		func(c *p2p.Config) { c.Host = "" },
		func(c *p2p.Config) { c.Port = 70000 },
		func(c *p2p.Config) { c.Fingerprint.BlockSize = 0 },
		func(c *p2p.Config) { c.MaxFrameBytes = 100 },
		func(c *p2p.Config) { c.PullTimeout = 0 },
		func(c *p2p.Config) { c.MaxSessionsPerHost = 0 },
		func(c *p2p.Config) { c.MaxAnswering = 0 },
	} {
		c := config()
		edit(&c)
		if c.Validate() == nil {
			t.Errorf("%+v validated", c)
		}
	}
}

// TestHalfOpenConnectionsBounded: connections that never finish their
// handshake are bounded; past the bound a new one is closed at once —
// while the silent ones are still held (their handshake timeout is a
// minute, past the client's 5 s deadline that bounds the wait) — and the
// node serves again once they are gone.
func TestHalfOpenConnectionsBounded(t *testing.T) {
	cfg := config()
	cfg.HandshakeTimeout = time.Minute
	hs := digests("l", 1)
	src, srcReg := node(t, cfg, newTier(hs...))
	const bound = 64 // the node's limit on handshakes under way
	silent := make([]net.Conn, 0, bound)
	for i := 0; i < bound; i++ {
		silent = append(silent, raw(t, src))
	}
	closedByPeer(t, raw(t, src)) // the connection past the bound
	if got := counter(t, srcReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "inbound", "outcome": "failed"}); got != 1 {
		t.Errorf("%v failed connections, want the one past the bound", got)
	}
	for _, c := range silent {
		_ = c.Close()
	}
	dst, _ := node(t, config(), newTier())
	testnet.Await(t, 10*time.Second, 50*time.Millisecond, func() error {
		_, err := pull(t, dst, src.ID(), hs, noHold)
		return err
	})
}

// TestHostileAnswers: a source answering with counts no honest source
// sends — hits or blocks past what was asked (up to 2^62, which overflowed
// a sum), or a flood of pulls under way — never panics the consumer: a
// count past what was asked fails the pull as rejected, counted as a
// malformed frame; an active count is taken up to p2p.MaxActive. The
// consumer pulls on afterwards.
func TestHostileAnswers(t *testing.T) {
	const huge = 1 << 62
	hs := digests("m", 2)
	for _, c := range []struct {
		name    string
		lookup  map[string]any
		fetch   map[string]any
		fails   bool
		hits    int // the leading hashes the consumer takes the source to hold
		reports int // the source's active pulls, as the consumer takes them
	}{
		{"hits and blocks of 2^62", map[string]any{"type": "lookup_resp", "hits": huge, "blocks": huge}, nil, true, 0, 0},
		{"more hits than asked", map[string]any{"type": "lookup_resp", "hits": 3}, nil, true, 0, 0},
		{"blocks in place of hits", map[string]any{"type": "lookup_resp", "blocks": 2}, nil, false, 0, 0},
		{"more blocks than asked", map[string]any{"type": "lookup_resp", "hits": 2},
			map[string]any{"type": "transfer_done", "success": true, "blocks": 3}, true, 0, 0},
		{"active 2^62", map[string]any{"type": "lookup_resp", "hits": 2, "active": huge},
			map[string]any{"type": "transfer_done", "success": true, "blocks": 2}, false, 2, p2p.MaxActive},
		{"active at the int's bound", map[string]any{"type": "lookup_resp", "hits": 2, "active": math.MaxInt64},
			map[string]any{"type": "transfer_done", "success": true, "blocks": 2}, false, 2, p2p.MaxActive},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := p2ptest.NewSource(t, fingerprint(), func(op string, _ int) map[string]any {
				if op == "lookup" {
					return c.lookup
				}
				return c.fetch
			})
			dst, dstReg := node(t, config(), newTier())
			var sawSrc []int
			res, err := pull(t, dst, src.ID, hs, func(_, srcActive, _ int, _ bool) time.Duration {
				sawSrc = append(sawSrc, srcActive)
				return 0
			})
			rejected := counter(t, dstReg, "kvroute_engine_p2p_frames_rejected_total", map[string]string{"reason": "malformed"})
			if c.fails {
				if p2p.Reason(err) != "rejected" || res.Blocks != 0 {
					t.Fatalf("pull: %+v, %v: want it rejected, nothing fetched", res, err)
				}
				if rejected != 1 {
					t.Errorf("%v malformed frames counted, want 1", rejected)
				}
				return
			}
			if err != nil || rejected != 0 {
				t.Fatalf("pull: %+v, %v (%v frames rejected)", res, err, rejected)
			}
			if res.Hits != c.hits || res.Blocks > res.Hits || res.SrcActive != c.reports {
				t.Errorf("pull: %+v: want %d hits, blocks ≤ hits, the source's pulls taken as %d", res, c.hits, c.reports)
			}
			if res.Hits > 0 && fmt.Sprint(sawSrc) != fmt.Sprint([]int{c.reports}) {
				t.Errorf("hold saw the source's pulls as %v, want [%d]", sawSrc, c.reports)
			}
			good, _ := node(t, config(), newTier(hs...))
			if res, err := pull(t, dst, good.ID(), hs, noHold); err != nil || res.Blocks != 2 {
				t.Errorf("a pull from an honest source after: %+v, %v", res, err)
			}
		})
	}
}

// TestCrossedDials: two nodes pulling from each other at once dial each
// other at once; the connection the lower identity dialled is kept, the
// other side's pulls go over it, and no pull fails. Each round ends with
// one connection between the pair.
func TestCrossedDials(t *testing.T) {
	const rounds, each = 40, 4
	ha, hb := digests("na", 3), digests("nb", 3)
	crossed := 0.0
	for r := 0; r < rounds; r++ {
		a, aReg := node(t, config(), newTier(ha...))
		b, bReg := node(t, config(), newTier(hb...))
		start := make(chan struct{})
		errs := make(chan error, 2*each)
		var wg sync.WaitGroup
		for i := 0; i < each; i++ {
			for _, c := range []struct {
				from *p2p.Node
				to   string
				hs   []blockkey.Digest
			}{{a, b.ID(), hb}, {b, a.ID(), ha}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if res, err := c.from.Pull(ctx, c.to, "r", c.hs, noHold); err != nil || res.Blocks != 3 {
						errs <- fmt.Errorf("round %d, %s from %s: %+v, %v (%s)", r, c.from.ID(), c.to, res, err, p2p.Reason(err))
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			return
		}
		testnet.Await(t, 5*time.Second, 5*time.Millisecond, func() error {
			for _, reg := range []*prometheus.Registry{aReg, bReg} {
				open := counter(t, reg, "kvroute_engine_p2p_sessions", nil)
				ready := counter(t, reg, "kvroute_engine_p2p_connections_total", map[string]string{"outcome": "ready"})
				if open != 1 || ready != 1 {
					return fmt.Errorf("round %d: %v connections open, %v made ready: want one", r, open, ready)
				}
			}
			return nil
		})
		crossed += counter(t, aReg, "kvroute_engine_p2p_connections_total", map[string]string{"outcome": "crossed"}) +
			counter(t, bReg, "kvroute_engine_p2p_connections_total", map[string]string{"outcome": "crossed"})
		a.Close()
		b.Close()
	}
	t.Logf("%v crossed connections in %d rounds", crossed, rounds)
}

// rawPeer is a scripted peer for the tests below: frames in and out over
// one connection, its JSON as maps.
type rawPeer struct {
	t *testing.T
	c net.Conn
}

func (p rawPeer) send(v map[string]any) {
	p.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		p.t.Error(err)
		return
	}
	if _, err := p.c.Write(lengthPrefixed(string(b))); err != nil {
		p.t.Error(err)
	}
}

func (p rawPeer) recv() map[string]any {
	p.t.Helper()
	var head [4]byte
	if _, err := io.ReadFull(p.c, head[:]); err != nil {
		p.t.Error(err)
		return nil
	}
	body := make([]byte, binary.BigEndian.Uint32(head[:]))
	if _, err := io.ReadFull(p.c, body); err != nil {
		p.t.Error(err)
		return nil
	}
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		p.t.Error(err)
	}
	return v
}

// TestCrossedDialWaits: a node whose dial the peer refused because the
// peer's own crossing dial is kept (the peer has the lower identity)
// waits for that connection, and its pull goes over it.
func TestCrossedDialWaits(t *testing.T) {
	var ln net.Listener
	var dst *p2p.Node
	var dstReg *prometheus.Registry
	for range 100 { // the peer's identity must sort before the node's
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		n, reg := node(t, config(), newTier())
		if l.Addr().String() < n.ID() {
			ln, dst, dstReg = l, n, reg
			break
		}
		_ = l.Close()
		n.Close()
	}
	if ln == nil {
		t.Fatal("no peer address sorting before the node's")
	}
	t.Cleanup(func() { _ = ln.Close() })
	peerID := ln.Addr().String()
	hs := digests("o", 3)

	done := make(chan error, 1)
	var res p2p.PullResult
	go func() {
		var err error
		res, err = pull(t, dst, peerID, hs, noHold)
		done <- err
	}()
	in, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close() }()
	_ = in.SetDeadline(time.Now().Add(10 * time.Second))
	theirs := rawPeer{t, in}
	if f := theirs.recv(); f["type"] != "connect" || f["id"] != dst.ID() {
		t.Fatalf("the node's dial opened with %v", f)
	}
	theirs.send(map[string]any{"type": "disconnect", "reason": "crossed dials: keeping the lower identity's connection"})
	_ = in.Close()

	out, err := net.DialTimeout("tcp", dst.ID(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = out.Close() }()
	_ = out.SetDeadline(time.Now().Add(10 * time.Second))
	ours := rawPeer{t, out}
	ours.send(map[string]any{"type": "connect", "version": 1, "id": peerID, "fingerprint": fingerprint()})
	if f := ours.recv(); f["type"] != "connect_ack" {
		t.Fatalf("the node answered the peer's connect with %v", f)
	}
	for _, want := range []string{"lookup", "fetch"} {
		f := ours.recv()
		if f["type"] != want {
			t.Fatalf("got %v, want a %s", f, want)
		}
		typ, field := "lookup_resp", "hits"
		if want == "fetch" {
			typ, field = "transfer_done", "blocks"
		}
		ours.send(map[string]any{"type": typ, "seq": f["seq"], field: len(hs), "success": true})
	}
	if err := <-done; err != nil || res.Blocks != len(hs) {
		t.Fatalf("pull: %+v, %v: want %d blocks over the peer's connection", res, err, len(hs))
	}
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"direction": "outbound", "outcome": "crossed"}, 1},
		{map[string]string{"direction": "inbound", "outcome": "ready"}, 1},
		{map[string]string{"outcome": "rejected"}, 0},
	} {
		if got := counter(t, dstReg, "kvroute_engine_p2p_connections_total", c.labels); got != c.want {
			t.Errorf("connections%v = %v, want %v", c.labels, got, c.want)
		}
	}
}

// TestIdentityIsTheAddressDialled: sessions are keyed by the peer's
// identity, and a dial knows only the address dialled, so a peer
// answering as another identity is refused (rejected, saying why).
func TestIdentityIsTheAddressDialled(t *testing.T) {
	hs := digests("p", 2)
	src := p2ptest.NewSource(t, fingerprint(), func(op string, n int) map[string]any {
		return map[string]any{"type": map[string]string{"lookup": "lookup_resp", "fetch": "transfer_done"}[op], "hits": n, "blocks": n}
	})
	src.AnswerAs("localhost:1")
	dst, dstReg := node(t, config(), newTier())
	_, err := pull(t, dst, src.ID, hs, noHold)
	if p2p.Reason(err) != "rejected" || !strings.Contains(err.Error(), "must be the address peers dial") {
		t.Fatalf("pull: %v: want it rejected for the identity", err)
	}
	if got := counter(t, dstReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "outbound", "outcome": "rejected"}); got != 1 {
		t.Errorf("%v outbound rejections", got)
	}
	src.AnswerAs("")
	if res, err := pull(t, dst, src.ID, hs, noHold); err != nil || res.Blocks != 2 {
		t.Errorf("answering as the address dialled: %+v, %v", res, err)
	}
}

// TestAnsweringBounded: the node answers at most MaxAnswering requests at
// once across its connections; one past it is answered at once as a miss
// (the consumer recomputes), counted as busy, and the one held is answered
// when its lookup ends.
func TestAnsweringBounded(t *testing.T) {
	cfg := config()
	cfg.MaxAnswering = 1
	hs := digests("q", 2)
	tr := newTier(hs...)
	tr.gate, tr.entered = make(chan struct{}), make(chan struct{}, 1)
	src, srcReg := node(t, cfg, tr)
	first, _ := node(t, config(), newTier())
	second, _ := node(t, config(), newTier())

	held := make(chan error, 1)
	var heldRes p2p.PullResult
	go func() {
		var err error
		heldRes, err = pull(t, first, src.ID(), hs, noHold)
		held <- err
	}()
	select {
	case <-tr.entered: // the first consumer's lookup holds the node's one slot
	case <-time.After(10 * time.Second):
		t.Fatal("the first lookup never reached the tier")
	}
	res, err := pull(t, second, src.ID(), hs, noHold)
	if err != nil || res.Hits != 0 || res.Blocks != 0 {
		t.Fatalf("a pull past the node's bound: %+v, %v: want a miss at once", res, err)
	}
	if got := counter(t, srcReg, "kvroute_engine_p2p_frames_rejected_total", map[string]string{"reason": "busy"}); got != 1 {
		t.Errorf("%v busy frames counted, want 1", got)
	}
	close(tr.gate)
	if err := <-held; err != nil || heldRes.Blocks != 2 {
		t.Fatalf("the pull held: %+v, %v: want 2 blocks once answered", heldRes, err)
	}
	if res, err := pull(t, second, src.ID(), hs, noHold); err != nil || res.Blocks != 2 {
		t.Errorf("a pull once the slot is free: %+v, %v", res, err)
	}
}

// TestSessionsPerHostBounded: one remote address holds at most
// MaxSessionsPerHost inbound connections, whatever identities it claims;
// one past it is refused and counted, and one is taken again once a
// connection closes.
func TestSessionsPerHostBounded(t *testing.T) {
	cfg := config()
	cfg.MaxSessionsPerHost = 2
	src, srcReg := node(t, cfg, newTier())
	admitted := func(id string) (net.Conn, bool) {
		c := raw(t, src)
		if _, err := c.Write(hello(id)); err != nil {
			t.Fatal(err)
		}
		f := rawPeer{t, c}.recv()
		return c, f["type"] == "connect_ack"
	}
	var open []net.Conn
	for i := 0; i < 2; i++ {
		c, ok := admitted("flood:" + strconv.Itoa(i))
		if !ok {
			t.Fatalf("connection %d refused under the bound", i)
		}
		open = append(open, c)
	}
	extra, ok := admitted("flood:2")
	if ok {
		t.Fatal("a third connection from one address admitted, bound 2")
	}
	closedByPeer(t, extra)
	if got := counter(t, srcReg, "kvroute_engine_p2p_connections_total", map[string]string{"direction": "inbound", "outcome": "rejected"}); got != 1 {
		t.Errorf("%v inbound rejections, want 1", got)
	}
	_ = open[0].Close()
	n := 3
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		n++
		if _, ok := admitted("flood:" + strconv.Itoa(n)); !ok {
			return errors.New("still refused after a connection closed")
		}
		return nil
	})
}
