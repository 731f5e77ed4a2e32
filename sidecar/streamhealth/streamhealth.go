package streamhealth

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// State is a live event stream's state.
type State uint8

const (
	// Unknown: no evidence yet (no live batch, no window judged).
	Unknown State = iota
	// Live: live batches arrive.
	Live
	// ReplayOnly: the engine stored new blocks, and their batches arrived
	// only through replay (the sidecar's catch-ups), none live.
	ReplayOnly
	// Silent: the engine stored new blocks, and no batch arrived at all.
	Silent
	// Partial: the sequencer lost events for good (replay could not
	// recover them).
	Partial
)

// States lists every state, in the order of the constants.
func States() []State { return []State{Unknown, Live, ReplayOnly, Silent, Partial} }

// String is the state's wire name (LoadReport.stream_state, /debug/state,
// the gauge's state label).
func (s State) String() string {
	switch s {
	case Unknown:
		return "unknown"
	case Live:
		return "live"
	case ReplayOnly:
		return "replay_only"
	case Silent:
		return "silent"
	case Partial:
		return "partial"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Config configures a Judge. Start from DefaultConfig, which holds the
// documented defaults: Validate (New calls it) rejects zero and invalid
// values, and fills nothing in. Bind's zero value (false) means the
// sidecar connects.
type Config struct {
	// Window is how long the engine's evidence of new blocks may go
	// without a live batch before the stream is judged silent or
	// replay-only. Keep it longer than the sidecar's idle check (its
	// catch-up period), so that a replay-only stream's catch-ups land in
	// every window. Default 2.5 s: with a ~200 ms scrape a one-sided
	// stream shows within about 3 s of the engine's first request.
	Window time.Duration
	// Slack: a batch that arrived up to this long before the scrape
	// interval in which the counters moved still answers them (an engine's
	// metrics may trail its events). Default 1 s.
	Slack time.Duration
	// MinNewBlocks is how many new blocks the counters must prove before
	// the engine counts as having published BlockStored events. Default 2.
	MinNewBlocks int
	// Bind says the sidecar's SUB binds (--kv-events-mode bind); false, the
	// default, says it connects. It picks the hint in the reasons.
	Bind bool
}

// DefaultConfig returns the defaults: a 2.5 s window, 1 s of slack, two
// blocks of evidence, a connecting sidecar.
func DefaultConfig() Config {
	return Config{Window: 2500 * time.Millisecond, Slack: time.Second, MinNewBlocks: 2}
}

// Validate checks c.
func (c Config) Validate() error {
	var errs []error
	if c.Window <= 0 {
		errs = append(errs, fmt.Errorf("streamhealth: window %v: want > 0", c.Window))
	}
	if c.Slack <= 0 {
		errs = append(errs, fmt.Errorf("streamhealth: slack %v: want > 0", c.Slack))
	}
	if c.MinNewBlocks < 1 {
		errs = append(errs, fmt.Errorf("streamhealth: min new blocks %d: want ≥ 1", c.MinNewBlocks))
	}
	return errors.Join(errs...)
}

// Counters are one scrape of the engine's /metrics, summed over its series.
type Counters struct {
	// PrefixQueries and PrefixHits are vllm:prefix_cache_queries_total and
	// vllm:prefix_cache_hits_total (tokens, counted when a request is first
	// admitted). HaveQueries says the engine exports them; without them
	// nothing is judged from the counters.
	PrefixQueries, PrefixHits float64
	HaveQueries               bool
	// Requests is vllm:request_success_total over every finished_reason;
	// HaveRequests says the engine exports it.
	Requests     float64
	HaveRequests bool
	// InFlight is vllm:num_requests_running + vllm:num_requests_waiting.
	InFlight float64
	// PromptTokens and GenerationTokens are vllm:prompt_tokens_total and
	// vllm:generation_tokens_total: shown in reasons, not evidence of new
	// blocks.
	PromptTokens, GenerationTokens float64
	// BlockSize is the engine's KV block size in tokens; 0 when unknown
	// (nothing is judged from the counters).
	BlockSize int
}

// usable reports whether c can carry new-block evidence: the counters are
// exported, finite and not negative, and the block size is known.
func (c Counters) usable() bool {
	ok := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 }
	return c.HaveQueries && c.BlockSize > 0 && ok(c.PrefixQueries) && ok(c.PrefixHits) &&
		(!c.HaveRequests || ok(c.Requests)) && ok(c.InFlight)
}

// computed is the tokens the engine computed (queries − hits).
func (c Counters) computed() float64 { return c.PrefixQueries - c.PrefixHits }

// Status is the verdict: the state, why (with the likely fix), and since
// when (zero for the initial unknown).
type Status struct {
	State  State
	Reason string
	Since  time.Time
}

// Judge holds one rank's evidence and applies the rules (see the package
// doc).
type Judge struct {
	cfg Config

	// The previous scrape.
	prev     Counters
	prevAt   time.Time
	havePrev bool
	// The baseline the evidence is counted from; growing once the
	// computed tokens moved past it, the first time at the scrape at
	// growthAt.
	base     Counters
	haveBase bool
	rebase   bool // take the next scrape as the baseline
	growing  bool
	growthAt time.Time

	// Evidence waiting for its verdict: batches from `from` on answer it;
	// it is judged at `due`.
	pending   bool
	from, due time.Time
	evidence  int // new blocks proven

	lastLive, lastReplay time.Time
	haveLive, haveReplay bool

	// The live stream's own verdict.
	verdict       State
	reason        string
	verdictSince  time.Time
	partial       bool
	partialReason string
	partialSince  time.Time
}

// New returns a Judge in the unknown state.
func New(cfg Config) (*Judge, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Judge{cfg: cfg}, nil
}

// Scraped observes a successful scrape of the engine at now.
func (j *Judge) Scraped(now time.Time, c Counters) {
	prev, prevAt, havePrev := j.prev, j.prevAt, j.havePrev
	j.prev, j.prevAt, j.havePrev = c, now, true
	if !c.usable() {
		j.haveBase, j.growing = false, false
		return
	}
	reset := havePrev && prev.usable() && (c.PrefixQueries < prev.PrefixQueries || c.PrefixHits < prev.PrefixHits ||
		c.HaveRequests && prev.HaveRequests && c.Requests < prev.Requests)
	if !havePrev || !prev.usable() || !j.haveBase || j.rebase || reset {
		j.restartBase(c)
		return
	}
	if !j.growing && c.computed() > prev.computed() {
		j.growing, j.growthAt = true, prevAt
	}
	if !j.growing {
		j.base = c // idle: the baseline follows the counters
		return
	}
	if j.pending {
		return // counted already: the window decides
	}
	bs := float64(c.BlockSize)
	tokens := c.computed() - j.base.computed()
	if c.HaveRequests && j.base.HaveRequests {
		tokens -= bs * (c.Requests - j.base.Requests + c.InFlight)
	}
	if blocks := math.Floor(tokens / bs); blocks >= float64(j.cfg.MinNewBlocks) {
		from := j.growthAt.Add(-j.cfg.Slack)
		if j.haveLive && !j.lastLive.Before(from) {
			j.restartBase(c) // a live batch answered it already
			return
		}
		j.pending, j.from, j.due = true, from, prevAt.Add(j.cfg.Window)
		j.evidence = int(min(blocks, 1<<30))
		return
	}
	if now.Sub(j.growthAt) > j.cfg.Window {
		j.restartBase(c) // growth that proves no new block: start over
	}
}

func (j *Judge) restartBase(c Counters) {
	j.base, j.haveBase, j.rebase, j.growing = c, true, false, false
}

// LiveBatch observes a batch received on the live socket at now: the
// stream is live.
func (j *Judge) LiveBatch(now time.Time) {
	j.lastLive, j.haveLive = now, true
	j.pending, j.rebase = false, true
	j.setVerdict(now, Live, "live batches arrive on the SUB socket")
}

// ReplayedBatch observes a batch applied through a replay exchange at now.
func (j *Judge) ReplayedBatch(now time.Time) {
	j.lastReplay, j.haveReplay = now, true
}

// SetPartial observes the sequencer's partial flag at now, with its reason
// when set.
func (j *Judge) SetPartial(now time.Time, partial bool, reason string) {
	if partial && !j.partial {
		j.partialSince = now
	}
	j.partial = partial
	if partial {
		j.partialReason = reason
	}
}

// Judge judges the window due by now, if any, and returns the status.
func (j *Judge) Judge(now time.Time) Status {
	if j.pending && !now.Before(j.due) {
		span := j.due.Sub(j.from).Round(time.Millisecond)
		switch {
		case j.haveLive && !j.lastLive.Before(j.from):
			j.setVerdict(now, Live, "live batches arrive on the SUB socket")
		case j.haveReplay && !j.lastReplay.Before(j.from):
			j.setVerdict(now, ReplayOnly, fmt.Sprintf("the engine stored at least %d new blocks, and in %v their events arrived only through the replay socket, none live: routing runs seconds stale; %s",
				j.evidence, span, j.hint()))
		default:
			j.setVerdict(now, Silent, fmt.Sprintf("the engine stored at least %d new blocks, and in %v no event batch arrived, live or replayed; %s",
				j.evidence, span, j.hint()))
		}
		j.pending, j.rebase = false, true
	}
	return j.Status()
}

// Status returns the status as last judged.
func (j *Judge) Status() Status {
	if j.partial {
		reason := "events were lost for good: " + j.partialReason
		if j.verdict == Silent || j.verdict == ReplayOnly {
			reason += "; and the live stream is " + j.verdict.String() + ": " + j.reason
		}
		return Status{State: Partial, Reason: reason, Since: j.partialSince}
	}
	if j.verdict == Unknown {
		return Status{State: Unknown, Reason: j.unknownReason()}
	}
	return Status{State: j.verdict, Reason: j.reason, Since: j.verdictSince}
}

func (j *Judge) setVerdict(now time.Time, s State, reason string) {
	if s != j.verdict {
		j.verdictSince = now
	}
	j.verdict, j.reason = s, reason
}

func (j *Judge) unknownReason() string {
	c := j.prev
	switch {
	case !j.havePrev:
		return "no evidence yet: the engine has not been scraped"
	case !c.HaveQueries:
		return "no evidence yet: no live batch, and the engine exports no vllm:prefix_cache_queries_total to judge the stream by"
	case c.BlockSize <= 0:
		return "no evidence yet: no live batch, and the engine's block size is not known yet"
	case !c.usable():
		return "no evidence yet: no live batch, and the engine's prefix-cache counters are not usable"
	}
	return fmt.Sprintf("no evidence yet: no live batch, and the engine has stored no new block since the sidecar started (it has served %.0f prompt and %.0f generation tokens in all)",
		c.PromptTokens, c.GenerationTokens)
}

// hint names the likely cause and fix, given the sidecar's mode.
func (j *Judge) hint() string {
	if j.cfg.Bind {
		return "the sidecar binds (--kv-events-mode bind), so the engine must connect to it: vLLM connects only when its --kv-events-config endpoint names a concrete host, and a wildcard host (tcp://*:5557) makes it bind too; " +
			"run the sidecar with --kv-events-mode connect (the default), or point the engine's endpoint at the sidecar's address; else check that --kv-events, --topic and the port (base + rank) match the engine's"
	}
	return "the sidecar connects (--kv-events-mode connect, the default), so the engine must bind: vLLM binds only when its --kv-events-config endpoint has a wildcard host (tcp://*:5557), and one that names a concrete host makes it connect out too; " +
		"run the sidecar with --kv-events-mode bind, or give the engine a wildcard endpoint; else check that --kv-events, --topic and the port (base + rank) match the engine's"
}
