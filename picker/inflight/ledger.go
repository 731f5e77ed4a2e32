package inflight

import (
	"errors"
	"fmt"
	"time"
)

// Config tunes the ledger. Start from DefaultConfig: a zero field is
// invalid, not a default, and Validate says which.
type Config struct {
	// PrefillTokensPerSecond is an engine's prefill rate: a pick's queued
	// prefill work shrinks at this rate from the moment it was made.
	// Default 5,000.
	PrefillTokensPerSecond float64
	// Forget is how long a pick counts without a load report covering it.
	// Default 30 s.
	Forget time.Duration
	// PerEndpoint bounds the picks kept per endpoint. Default 4,096.
	PerEndpoint int
	// PeerLifetime bounds how long another picker's booking counts here
	// (Bookings.Apply): past it, counted from when the pick was made, it
	// is dropped, whether or not its release came, so a lost release
	// never leaves a phantom. Default 30 s, as Forget.
	PeerLifetime time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{PrefillTokensPerSecond: 5000, Forget: 30 * time.Second, PerEndpoint: 4096, PeerLifetime: 30 * time.Second}
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []error
	if !(c.PrefillTokensPerSecond > 0) {
		errs = append(errs, fmt.Errorf("prefill rate %v tokens/s: want a positive rate", c.PrefillTokensPerSecond))
	}
	if c.Forget <= 0 {
		errs = append(errs, errors.New("in-flight forget interval must be positive"))
	}
	if c.PeerLifetime <= 0 {
		errs = append(errs, fmt.Errorf("peer booking lifetime %v: want a positive duration", c.PeerLifetime))
	}
	if c.PerEndpoint < 1 {
		errs = append(errs, fmt.Errorf("in-flight picks per endpoint %d: want at least 1", c.PerEndpoint))
	}
	return errors.Join(errs...)
}

// Ledger holds the picks not yet covered by a load report. It is not safe
// for concurrent use.
type Ledger struct {
	cfg   Config
	sends map[string][]send // endpoint → picks, oldest first
	next  uint64
}

// send is one pick.
type send struct {
	id     uint64
	at     time.Time
	tokens float64 // uncached prompt tokens
}

// Pending is what an endpoint has in flight from this picker.
type Pending struct {
	Count  int     // picks no load report covers yet
	Tokens float64 // their remaining prefill work, aged
	// AwaitCount and AwaitTokens are the carried picks before their first
	// output token, whether a report covers them or not, and their
	// uncached prompt tokens (Bookings.Pending; the Ledger leaves them 0).
	AwaitCount  int
	AwaitTokens float64
	// PullsOut are this picker's carried picks elsewhere pulling a prefix
	// out of this endpoint's CPU tier before their first output token
	// (Bookings.Pending; the Ledger leaves it 0).
	PullsOut int
}

// New returns an empty ledger.
func New(cfg Config) (*Ledger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Ledger{cfg: cfg, sends: map[string][]send{}}, nil
}

// Record notes a pick of endpoint at now with tokens of uncached prompt
// (negative counts as none), and returns its id for Done.
func (l *Ledger) Record(endpoint string, tokens float64, now time.Time) uint64 {
	l.next++
	s := l.sends[endpoint]
	if len(s) >= l.cfg.PerEndpoint {
		s = s[1:]
	}
	l.sends[endpoint] = append(s, send{id: l.next, at: now, tokens: max(tokens, 0)})
	return l.next
}

// Done ends a pick (its request finished). An id already gone is ignored.
func (l *Ledger) Done(endpoint string, id uint64) {
	s := l.sends[endpoint]
	for i := range s {
		if s[i].id == id {
			l.sends[endpoint] = append(s[:i:i], s[i+1:]...)
			return
		}
	}
}

// Pending is what endpoint has in flight at now, given that its last load
// report arrived at reported (zero: none yet). Picks the report covers,
// and picks older than Forget, are dropped.
func (l *Ledger) Pending(endpoint string, reported, now time.Time) Pending {
	var p Pending
	all := l.sends[endpoint]
	kept := all[:0]
	for _, s := range all {
		if !s.at.After(reported) || now.Sub(s.at) > l.cfg.Forget {
			continue
		}
		kept = append(kept, s)
		p.Count++
		p.Tokens += max(0, s.tokens-now.Sub(s.at).Seconds()*l.cfg.PrefillTokensPerSecond)
	}
	if len(kept) == 0 {
		delete(l.sends, endpoint)
	} else {
		l.sends[endpoint] = kept
	}
	return p
}
