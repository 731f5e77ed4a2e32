package gossip

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Partitionable is a UDP/TCP transport that can be cut off from the
// network and healed again, for partition tests: while cut, it drops every
// packet in and out and refuses every stream.
type Partitionable struct {
	inner   *memberlist.NetTransport
	cut     atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	stop    chan struct{}
	once    sync.Once
}

// NewPartitionable listens on addr:port (0: a free port).
func NewPartitionable(addr string, port int) (*Partitionable, error) {
	inner, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{addr}, BindPort: port})
	if err != nil {
		return nil, err
	}
	p := &Partitionable{inner: inner, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), stop: make(chan struct{})}
	go func() {
		for {
			select {
			case pk := <-inner.PacketCh():
				if !p.cut.Load() {
					select {
					case p.packets <- pk:
					case <-p.stop:
						return
					}
				}
			case <-p.stop:
				return
			}
		}
	}()
	go func() {
		for {
			select {
			case c := <-inner.StreamCh():
				if p.cut.Load() {
					c.Close()
					continue
				}
				select {
				case p.streams <- c:
				case <-p.stop:
					c.Close()
					return
				}
			case <-p.stop:
				return
			}
		}
	}()
	return p, nil
}

// Cut isolates the transport; Heal reconnects it.
func (p *Partitionable) Cut()  { p.cut.Store(true) }
func (p *Partitionable) Heal() { p.cut.Store(false) }

// FinalAdvertiseAddr implements memberlist.Transport.
func (p *Partitionable) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return p.inner.FinalAdvertiseAddr(ip, port)
}

// WriteTo implements memberlist.Transport; while cut the packet is lost.
func (p *Partitionable) WriteTo(b []byte, addr string) (time.Time, error) {
	if p.cut.Load() {
		return time.Now(), nil
	}
	return p.inner.WriteTo(b, addr)
}

// PacketCh implements memberlist.Transport.
func (p *Partitionable) PacketCh() <-chan *memberlist.Packet { return p.packets }

// DialTimeout implements memberlist.Transport; while cut it fails.
func (p *Partitionable) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if p.cut.Load() {
		return nil, errors.New("gossip: partitioned")
	}
	return p.inner.DialTimeout(addr, timeout)
}

// StreamCh implements memberlist.Transport.
func (p *Partitionable) StreamCh() <-chan net.Conn { return p.streams }

// Shutdown implements memberlist.Transport. The inner transport's
// listeners hand what arrives to unbuffered channels and are waited for:
// once the forwarders have stopped, what still arrives is drained here
// until they have ended, or a packet arriving during the shutdown would
// block one of them, and the shutdown, for ever.
func (p *Partitionable) Shutdown() error {
	p.once.Do(func() { close(p.stop) })
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-p.inner.PacketCh():
			case c := <-p.inner.StreamCh():
				c.Close()
			case <-done:
				return
			}
		}
	}()
	err := p.inner.Shutdown()
	close(done)
	return err
}
