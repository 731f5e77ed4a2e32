package picker

import "time"

// FirstChunk: a pick's first streamed chunk reached the picker.
func (r *Router) FirstChunk(p *Pick, now time.Time) {
	r.prefillDone(p)
	r.bookings.peerFirstToken(p, now)
}

// FirstToken: a pick's first output token reached the picker.
func (r *Router) FirstToken(p *Pick, now time.Time) {}
