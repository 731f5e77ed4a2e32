package sidecar

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// Drain tells every watching picker that this sidecar's engines are going
// away, for reason (such as the signal that stops the process): from now
// on every load report carries draining, and one goes out at once for
// each endpoint. Pickers then send those engines no new request, while
// those in flight finish. Drain then waits Config.DrainDelay, or until no
// picker watches, or ctx ends, so the announcement reaches every picker
// before the sidecar leaves; call Close after it. /readyz fails from the
// announcement on. A second call only waits.
func (s *Sidecar) Drain(ctx context.Context, reason string) {
	if reason == "" {
		reason = "draining"
	}
	if s.drain.CompareAndSwap(nil, &reason) {
		for _, ep := range s.endpoints {
			ep.mu.Lock()
			s.hub.load(loadUpdate(ep.identity.Endpoint, ep.epoch, ep.load, ep.stream, reason))
			ep.mu.Unlock()
		}
		s.metrics.draining.Set(1)
		s.log.Info("draining: pickers are told to send these engines no new request",
			zap.String("reason", reason), zap.Int("watching_pickers", s.hub.watchers()), zap.Duration("drain_delay", s.cfg.DrainDelay))
	}
	if s.cfg.DrainDelay <= 0 {
		return
	}
	deadline := time.NewTimer(s.cfg.DrainDelay)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for s.hub.watchers() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-poll.C:
		}
	}
}

// drainReason is the drain announced, "" while none is.
func (s *Sidecar) drainReason() string {
	if r := s.drain.Load(); r != nil {
		return *r
	}
	return ""
}
