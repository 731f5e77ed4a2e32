package enginesim

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/kvevents"
)

// publisher is one rank's vLLM ZmqEventPublisher: a PUB socket for live
// batches and a ROUTER answering replay requests from a ring of recent
// batches. publish is called from the scheduler goroutine only; the sockets
// live in their own goroutines.
type publisher struct {
	log          *zap.Logger
	metrics      *metrics
	topic        []byte
	layout       kvevents.Layout
	replayLayout kvevents.ReplayLayout

	zctx           *zmq.Context
	pubEndpoint    string // as bound or connected (bound ephemeral ports resolved)
	replayEndpoint string // "" when replay is off

	nextSeq uint64 // scheduler goroutine only
	buf     []byte

	mu      sync.Mutex
	ring    []ringEntry // oldest first, at most ringCap
	ringCap int
	drop    float64 // percent of batches not sent live
	delay   time.Duration
	rng     *rand.Rand

	live chan liveMsg
	quit chan struct{}
	wg   sync.WaitGroup
}

type ringEntry struct {
	seq     uint64
	payload []byte
}

type liveMsg struct {
	sent  time.Time
	seq   uint64
	frame []byte
}

// liveQueue sizes the queue in front of the PUB socket from its high-water
// mark (0 means unlimited in ZeroMQ; the queue stays bounded).
func liveQueue(hwm int) int {
	if hwm <= 0 || hwm > 1<<16 {
		return 1 << 16
	}
	return hwm
}

// newPublisher opens the sockets for one rank.
// A restarted process reuses the endpoints its predecessor resolved
// (pubAt, replayAt), as a real engine keeps its configured ports.
func newPublisher(cfg *Config, rank int, log *zap.Logger, m *metrics, seed uint64, pubAt, replayAt string) (*publisher, error) {
	endpoint, err := offsetEndpointPort(cfg.KVEvents.Endpoint, rank)
	if err != nil {
		return nil, err
	}
	if pubAt != "" {
		endpoint = pubAt
	}
	p := &publisher{
		log: log, metrics: m,
		topic:        []byte(cfg.KVEvents.Topic),
		layout:       cfg.Sim.EventLayout,
		replayLayout: cfg.Sim.ReplayLayout,
		ringCap:      cfg.KVEvents.BufferSteps,
		drop:         cfg.Sim.DropEventsPercent,
		delay:        cfg.Sim.EventDelay,
		rng:          rand.New(rand.NewPCG(seed, uint64(rank))),
		live:         make(chan liveMsg, liveQueue(cfg.KVEvents.HWM)),
		quit:         make(chan struct{}),
	}
	if p.zctx, err = zmq.NewContext(); err != nil {
		return nil, err
	}
	pub, err := p.zctx.NewSocket(zmq.PUB)
	if err != nil {
		p.zctx.Term()
		return nil, err
	}
	var router *zmq.Socket
	fail := func(err error) (*publisher, error) {
		pub.Close()
		if router != nil {
			router.Close()
		}
		p.zctx.Term()
		return nil, err
	}
	if err := pub.SetLinger(0); err != nil {
		return fail(err)
	}
	if err := pub.SetSndhwm(cfg.KVEvents.HWM); err != nil {
		return fail(err)
	}
	if pubBinds(endpoint) {
		if err := pub.Bind(endpoint); err != nil {
			return fail(fmt.Errorf("kv events: bind %s: %w", endpoint, err))
		}
		if endpoint, err = pub.GetLastEndpoint(); err != nil {
			return fail(err)
		}
	} else if err := pub.Connect(endpoint); err != nil {
		return fail(fmt.Errorf("kv events: connect %s: %w", endpoint, err))
	}
	p.pubEndpoint = endpoint
	if re := cfg.KVEvents.ReplayEndpoint; re != nil && *re != "" {
		rep, err := offsetEndpointPort(*re, rank)
		if err != nil {
			return fail(err)
		}
		if replayAt != "" {
			rep = replayAt
		}
		if router, err = p.zctx.NewSocket(zmq.ROUTER); err != nil {
			return fail(err)
		}
		if err := router.SetLinger(0); err != nil {
			return fail(err)
		}
		if err := router.SetRcvtimeo(50 * time.Millisecond); err != nil {
			return fail(err)
		}
		if err := router.Bind(rep); err != nil { // the ROUTER always binds
			return fail(fmt.Errorf("kv events replay: bind %s: %w", rep, err))
		}
		if p.replayEndpoint, err = router.GetLastEndpoint(); err != nil {
			return fail(err)
		}
	}
	p.wg.Add(1)
	go p.sendLoop(pub)
	if router != nil {
		p.wg.Add(1)
		go p.replayLoop(router)
	}
	return p, nil
}

// publish encodes one step's batch with the next seq, keeps it for replay
// and sends it live (unless the drop fault swallows it).
func (p *publisher) publish(batch *kvevents.Batch) {
	seq := p.nextSeq
	p.nextSeq++
	var err error
	p.buf, err = kvevents.AppendBatch(p.buf[:0], batch, p.layout)
	if err != nil { // our own events always encode
		p.log.Error("encoding kv events", zap.Error(err))
		return
	}
	payload := append([]byte(nil), p.buf...)
	for _, ev := range batch.Events {
		p.metrics.events.WithLabelValues(ev.Type.String()).Inc()
	}
	p.mu.Lock()
	if len(p.ring) == p.ringCap {
		copy(p.ring, p.ring[1:])
		p.ring = p.ring[:len(p.ring)-1]
	}
	p.ring = append(p.ring, ringEntry{seq, payload})
	dropped := p.drop > 0 && p.rng.Float64()*100 < p.drop
	p.mu.Unlock()
	if dropped {
		p.metrics.eventBatchesDropped.WithLabelValues("fault").Inc()
		return
	}
	select {
	case p.live <- liveMsg{sent: time.Now(), seq: seq, frame: payload}:
	default: // like a PUB past its high-water mark
		p.metrics.eventBatchesDropped.WithLabelValues("hwm").Inc()
	}
}

func (p *publisher) setFaults(dropPct float64, delay time.Duration) {
	p.mu.Lock()
	p.drop, p.delay = dropPct, delay
	p.mu.Unlock()
}

func (p *publisher) sendLoop(pub *zmq.Socket) {
	defer p.wg.Done()
	defer pub.Close()
	for {
		select {
		case <-p.quit:
			return
		case m := <-p.live:
			// The delay fault is re-read while waiting, so clearing it
			// releases held batches at once.
			for {
				p.mu.Lock()
				wait := time.Until(m.sent.Add(p.delay))
				p.mu.Unlock()
				if wait <= 0 {
					break
				}
				t := time.NewTimer(min(wait, 20*time.Millisecond))
				select {
				case <-t.C:
				case <-p.quit:
					t.Stop()
					return
				}
			}
			msg := kvevents.Message{Topic: p.topic, Seq: m.seq, Payload: m.frame}
			if _, err := pub.SendMessage(msg.Frames()); err != nil {
				p.log.Warn("publishing kv events", zap.Uint64("seq", m.seq), zap.Error(err))
			}
		}
	}
}

func (p *publisher) replayLoop(router *zmq.Socket) {
	defer p.wg.Done()
	defer router.Close()
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		frames, err := router.RecvMessageBytes(0)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
				continue // receive timeout: check quit
			}
			select {
			case <-p.quit:
				return
			default:
			}
			p.log.Warn("replay socket", zap.Error(err))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		id, start, err := kvevents.ParseReplayRequest(frames)
		if err != nil {
			p.log.Warn("invalid replay request", zap.Int("frames", len(frames)))
			p.metrics.replayRequests.WithLabelValues("invalid").Inc()
			continue
		}
		p.metrics.replayRequests.WithLabelValues("ok").Inc()
		p.mu.Lock()
		var entries []ringEntry
		for _, e := range p.ring {
			if e.seq >= start {
				entries = append(entries, e)
			}
		}
		p.mu.Unlock()
		for _, e := range entries {
			reply := append([][]byte{id}, kvevents.ReplayReply(p.replayLayout, p.topic, e.seq, e.payload)...)
			if _, err := router.SendMessage(reply); err != nil {
				p.log.Warn("replay reply", zap.Error(err))
				break
			}
		}
		if _, err := router.SendMessage(append([][]byte{id}, kvevents.ReplayEnd(p.replayLayout)...)); err != nil {
			p.log.Warn("replay end marker", zap.Error(err))
		}
	}
}

// close stops the goroutines and closes the sockets.
func (p *publisher) close() {
	close(p.quit)
	p.wg.Wait()
	p.zctx.Term()
}
