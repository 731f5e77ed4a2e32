package fleetview_test

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// countingProxy forwards one TCP address on 127.0.0.1 and counts the
// bytes sent towards it (upstream: what the picker writes).
type countingProxy struct {
	ln       net.Listener
	upstream atomic.Int64
	wg       sync.WaitGroup
}

func startCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			p.wg.Add(2)
			go func() {
				defer p.wg.Done()
				_, _ = io.Copy(s, io.TeeReader(c, counter{&p.upstream}))
				s.Close()
			}()
			go func() {
				defer p.wg.Done()
				_, _ = io.Copy(c, s)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		p.wg.Wait()
	})
	return p
}

type counter struct{ n *atomic.Int64 }

func (c counter) Write(b []byte) (int, error) { c.n.Add(int64(len(b))); return len(b), nil }

// TestStreamIsQuietTowardsTheSidecar: once its summary stream runs, the
// picker writes next to nothing to the sidecar however many updates it
// reads — no window update and ping after each (gRPC's bandwidth probe,
// which a static window turns off): fewer bytes than updates over 200
// deltas. With the probe on it writes about 30 bytes per update.
func TestStreamIsQuietTowardsTheSidecar(t *testing.T) {
	params := summary.ForCapacity(65536) // a 128 KiB snapshot: more than gRPC's default 64 KiB window
	s := simsidecar.Start(t, simsidecar.Config{Index: 0, Params: params, Rate: 1000})
	proxy := startCountingProxy(t, s.Addr())
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(viewConfig(params, 20*time.Millisecond), zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.WatchStatic(proxy.ln.Addr().String())
	deltas := func() float64 {
		return metrictest.Gathered(t, reg, "kvroute_picker_summary_updates_total", map[string]string{"kind": "delta"})
	}
	testnet.Await(t, 20*time.Second, 10*time.Millisecond, func() error {
		if d := deltas(); d < 10 {
			return fmt.Errorf("%v deltas applied", d)
		}
		return nil
	})
	d0, w0 := deltas(), proxy.upstream.Load()
	testnet.Await(t, 30*time.Second, 10*time.Millisecond, func() error {
		if d := deltas(); d < d0+200 {
			return fmt.Errorf("%v deltas applied since, of 200", d-d0)
		}
		return nil
	})
	d1, w1 := deltas(), proxy.upstream.Load()
	if w1-w0 >= int64(d1-d0) {
		t.Fatalf("the picker wrote %d bytes to the sidecar while it read %v deltas (and load reports): want fewer bytes than deltas", w1-w0, d1-d0)
	}
}
