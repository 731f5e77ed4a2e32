package standing

import (
	"container/list"
	"errors"
	"fmt"
	"math"
	"time"
)

// Config sizes a Ledger.
type Config struct {
	// HalfLife is how fast use is forgotten: a request weighs half as
	// much after it.
	HalfLife time.Duration
	// Window is how long a key stays active (counted in the fair share)
	// after its last request.
	Window time.Duration
	// Slack is how far above its share (a fraction of the share) a key's
	// use may go and still be within it.
	Slack float64
	// MaxKeys bounds the keys kept.
	MaxKeys int
	// Ahead is the fraction of the fair share below which a key's
	// request goes ahead (Standing.Ahead): with others active, a key using
	// less than Ahead × its share is well within it. 0: none goes ahead.
	Ahead float64
}

// DefaultConfig returns the defaults: a 2 s half-life, a 10 s window,
// 25% slack, 4,096 keys, and a key under half its share goes ahead.
func DefaultConfig() Config {
	return Config{HalfLife: 2 * time.Second, Window: 10 * time.Second, Slack: 0.25, MaxKeys: 4096, Ahead: 0.5}
}

// Validate checks c.
func (c Config) Validate() error {
	var errs []error
	if c.HalfLife <= 0 || c.Window <= 0 {
		errs = append(errs, fmt.Errorf("standing: half-life %v and window %v must be positive", c.HalfLife, c.Window))
	}
	if c.Slack < 0 || math.IsNaN(c.Slack) || math.IsInf(c.Slack, 0) {
		errs = append(errs, fmt.Errorf("standing: slack %v must be a finite fraction ≥ 0", c.Slack))
	}
	if !(c.Ahead >= 0 && c.Ahead <= 1) {
		errs = append(errs, fmt.Errorf("standing: ahead %v must be a fraction of the share, 0..1", c.Ahead))
	}
	if c.MaxKeys < 1 {
		errs = append(errs, fmt.Errorf("standing: max keys %d must be at least 1", c.MaxKeys))
	}
	return errors.Join(errs...)
}

// Ledger is one model group's account of its keys' use.
type Ledger struct {
	cfg  Config
	keys map[string]*list.Element // of *account
	lru  list.List                // most recently seen first
	// total is the keys' use summed, decayed to at.
	total float64
	at    time.Time
}

type account struct {
	key  string
	use  float64   // decayed to at
	at   time.Time // of use
	seen time.Time // the key's last request
}

// New returns an empty ledger; cfg must be valid.
func New(cfg Config) (*Ledger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Ledger{cfg: cfg, keys: map[string]*list.Element{}}, nil
}

// decay is the weight of use recorded at from, at now.
func (l *Ledger) decay(from, now time.Time) float64 {
	d := now.Sub(from)
	if d <= 0 {
		return 1
	}
	return math.Exp2(-d.Seconds() / l.cfg.HalfLife.Seconds())
}

// Standing is a key's place against its share.
type Standing struct {
	Use   float64 // the key's use before this request
	Share float64 // the fair share then (0 with no active key)
	Keys  int     // the active keys, this one included
	// Beyond is whether the key's use exceeded its share by more than the
	// slack.
	Beyond bool
	// Ahead is whether the key is well within its share: other keys are
	// active and its use is below Config.Ahead × the share. The picker
	// lets such a request past a saturated group's queue (the engine runs
	// it before the others).
	Ahead bool
}

// Charge judges key's standing at now, then charges it cost (at least 0)
// for a request.
func (l *Ledger) Charge(key string, cost float64, now time.Time) Standing {
	l.expire(now)
	if cost < 0 || math.IsNaN(cost) {
		cost = 0
	}
	l.total *= l.decay(l.at, now)
	if now.After(l.at) {
		l.at = now
	}
	var a *account
	if e, ok := l.keys[key]; ok {
		a = e.Value.(*account)
		a.use *= l.decay(a.at, now)
		a.at = now
		l.lru.MoveToFront(e)
	} else {
		if len(l.keys) >= l.cfg.MaxKeys {
			l.drop(l.lru.Back())
		}
		a = &account{key: key, at: now}
		l.keys[key] = l.lru.PushFront(a)
	}
	s := Standing{Use: a.use, Keys: len(l.keys)}
	s.Share = l.total / float64(len(l.keys))
	s.Beyond = a.use > s.Share*(1+l.cfg.Slack)
	s.Ahead = s.Keys >= 2 && a.use < s.Share*l.cfg.Ahead
	a.use += cost
	a.seen = now
	l.total += cost
	return s
}

// expire forgets the keys idle for longer than the window, oldest first.
func (l *Ledger) expire(now time.Time) {
	for e := l.lru.Back(); e != nil; e = l.lru.Back() {
		if now.Sub(e.Value.(*account).seen) <= l.cfg.Window {
			return
		}
		l.drop(e)
	}
}

// drop forgets e's key and takes its use out of the total.
func (l *Ledger) drop(e *list.Element) {
	a := e.Value.(*account)
	l.total -= a.use * l.decay(a.at, l.at)
	if l.total < 0 || len(l.keys) == 1 {
		l.total = 0
	}
	l.lru.Remove(e)
	delete(l.keys, a.key)
}

// Keys returns the number of keys kept.
func (l *Ledger) Keys() int { return len(l.keys) }

// MaxBand bounds the admission bands Priority maps.
const MaxBand = 100

// Priority is vLLM's priority (lower runs first) for a request of
// admission band (higher first, clamped to ±MaxBand) whose key stands
// as s: −2·band, plus 1 beyond its share.
func Priority(band int, s Standing) int {
	band = max(-MaxBand, min(MaxBand, band))
	p := -2 * band
	if s.Beyond {
		p++
	}
	return p
}
