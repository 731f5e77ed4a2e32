package picker

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/picker/inflight"
)

// Shared bookings (DESIGN.md §16): the pickers of a fleet exchange their
// bookings, so each decision counts the other pickers' picks in flight
// as its own. The router journals its own bookings (ShareBookings); a
// shell (the picker's bookings stream, or the lab) takes the journal
// (TakeBookings), sends it to the other pickers, and applies theirs
// (ApplyBookings). A booking of another picker's counts until released
// or until Config.PeerBookingLifetime has passed since its pick.

// ShareBookings turns the journal of this router's bookings on or off
// (off drops what was kept). A router whose journal nobody takes must
// leave it off: the journal grows until taken (bounded by
// inflight.JournalLimit).
func (r *Router) ShareBookings(on bool) {
	k := &r.bookings
	k.mu.Lock()
	k.b.Journal(on)
	k.mu.Unlock()
}

// TakeBookings returns the changes to this router's bookings since the
// last call (inflight.Bookings.TakeJournal), at now; overflow: some were
// dropped, and each other picker must be sent LiveBookings instead.
func (r *Router) TakeBookings(now time.Time) (ops []inflight.Op, overflow bool) {
	k := &r.bookings
	k.mu.Lock()
	ops, overflow = k.b.TakeJournal(now)
	k.mu.Unlock()
	return ops, overflow
}

// LiveBookings are this router's bookings that count now, each as an
// add with its state: what a picker that starts following this one is
// sent first.
func (r *Router) LiveBookings() []inflight.Op {
	k := &r.bookings
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.b.Live()
}

// ApplyBookings applies another picker's booking changes, received at
// now (each add's At on this router's clock), to the bookings its
// decisions count (inflight.Bookings.Apply). peer names the other picker
// as this picker follows it (its address), never as it names itself.
func (r *Router) ApplyBookings(peer string, ops []inflight.Op, now time.Time) {
	k := &r.bookings
	k.mu.Lock()
	k.b.Apply(peer, ops, now)
	phantoms := k.b.Expire(now)
	k.mu.Unlock()
	r.pm.received.Add(float64(len(ops)))
	r.pm.expired.Add(float64(phantoms))
}

// ForgetPicker drops every booking of peer: it left the fleet, or sends
// its live bookings again from the start; with figures, its figures too.
func (r *Router) ForgetPicker(peer string, figures bool) {
	k := &r.bookings
	k.mu.Lock()
	k.b.DropPeer(peer, figures)
	k.mu.Unlock()
}

// PickerBookings is, per other picker applied, what this router holds of
// its bookings now.
func (r *Router) PickerBookings() map[string]inflight.PeerStat {
	k := &r.bookings
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.b.Peers()
}

// peerMetrics count the bookings exchanged with the other pickers.
type peerMetrics struct {
	sent, received, expired prometheus.Counter
	connected               prometheus.Gauge
	lag                     *prometheus.GaugeVec
	streams                 *prometheus.CounterVec
}

func newPeerMetrics(reg prometheus.Registerer) *peerMetrics {
	m := &peerMetrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "picker", Name: "bookings_sent_total",
			Help: "Booking changes (picks, pulls, first bytes and tokens, ends) this picker sent the other pickers, each counted once per receiving picker."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "picker", Name: "bookings_received_total",
			Help: "Booking changes received from the other pickers and applied."}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "picker", Name: "bookings_expired_total",
			Help: "Other pickers' bookings dropped at --peer-booking-lifetime while still awaiting their first token: releases that were lost."}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "picker", Name: "pickers_following",
			Help: "Other pickers whose bookings stream this picker follows now."}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "picker", Name: "picker_bookings_lag_seconds",
			Help: "Per other picker (its address), the age of the last batch of bookings received from it when it arrived, by the two pickers' clocks."}, []string{"picker"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "picker", Name: "picker_streams_total",
			Help: "Bookings streams to the other pickers ended, by cause: error (dial or stream failure), behind (the sender cut a follower too slow), gone (the picker left)."}, []string{"cause"}),
	}
	if reg != nil {
		reg.MustRegister(m.sent, m.received, m.expired, m.connected, m.lag, m.streams)
	}
	return m
}
