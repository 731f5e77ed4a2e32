package gossip

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Name conflicts. memberlist refuses a member that claims a name another
// member holds at another address, and tells the conflict delegate each
// time gossip repeats the claim. A conflict is held from its first notice:
// logged once at error level, counted, and shown by the gauge (and, when
// the name is this node's, by Conflict, which fails /readyz). Every Rejoin
// the claimant is contacted: one still there renews the conflict as its
// state is merged. A conflict two such contacts in a row did not renew
// (the claimant left, or the holder's departure let the claimant in) is
// resolved, with one info line.

// Conflict kinds, the metrics' kind label.
const (
	kindSelf   = "self"   // another member claims this node's name
	kindOthers = "others" // two other members claim one name
)

const (
	// maxConflicts bounds the conflicts held (and contacted each round).
	maxConflicts = 8
	// conflictMisses is how many unrenewing contacts resolve a conflict.
	conflictMisses = 2
)

// conflictKey is a contested name and the address of the member refused.
type conflictKey struct{ name, claimant string }

type conflict struct {
	self    bool   // the name is this node's
	holder  string // where this node knows the name
	notices int    // notices so far
	misses  int    // contacts in a row that brought no notice
}

func (c *conflict) kind() string {
	if c.self {
		return kindSelf
	}
	return kindOthers
}

// conflicts serves memberlist's ConflictDelegate. memberlist calls it
// holding its node lock: it must not call back into memberlist.
type conflicts Members

func (c *conflicts) NotifyConflict(existing, other *memberlist.Node) {
	m := (*Members)(c)
	key, holder := conflictKey{name: existing.Name, claimant: nodeAddr(other)}, nodeAddr(existing)
	m.mu.Lock()
	defer m.mu.Unlock()
	if cf, ok := m.conflicts[key]; ok {
		cf.notices++
		cf.misses = 0
		cf.holder = holder
		return
	}
	if len(m.conflicts) >= maxConflicts {
		return
	}
	cf := &conflict{self: existing.Name == m.name, holder: holder, notices: 1}
	m.conflicts[key] = cf
	log := m.log.WithOptions(zap.AddStacktrace(zapcore.InvalidLevel)) // the stack is memberlist's gossip handling
	if cf.self {
		log.Error("gossip name conflict: another member claims this node's name, so one of the two cannot join; give each process its own --node-name",
			zap.String("name", key.name), zap.String("this", holder), zap.String("other", key.claimant))
	} else {
		log.Error("gossip name conflict: two members claim one name and only the first is seen here; give each process its own --node-name",
			zap.String("name", key.name), zap.String("seen", holder), zap.String("refused", key.claimant))
	}
	if m.conflictsSeen != nil {
		m.conflictsSeen.WithLabelValues(cf.kind()).Inc()
	}
	m.conflictGauges()
}

// conflictGauges sets the gauge per kind (m.mu held).
func (m *Members) conflictGauges() {
	if m.inConflict == nil {
		return
	}
	held := map[string]float64{kindSelf: 0, kindOthers: 0}
	for _, cf := range m.conflicts {
		held[cf.kind()] = 1
	}
	for k, v := range held {
		m.inConflict.WithLabelValues(k).Set(v)
	}
}

// recheckConflicts contacts each conflict's claimant and resolves the
// conflicts that stopped being renewed.
func (m *Members) recheckConflicts() {
	type probe struct {
		key     conflictKey
		notices int
	}
	var probes []probe
	m.mu.Lock()
	for k, cf := range m.conflicts {
		probes = append(probes, probe{k, cf.notices})
	}
	m.mu.Unlock()
	for _, p := range probes {
		// A push/pull with the claimant: its state names it, so a claimant
		// still there notifies the conflict again before Join returns.
		_, _ = m.ml.Join([]string{p.key.claimant})
		m.mu.Lock()
		if cf := m.conflicts[p.key]; cf != nil && cf.notices == p.notices {
			if cf.misses++; cf.misses >= conflictMisses {
				delete(m.conflicts, p.key)
				m.conflictGauges()
				m.log.Info("gossip name conflict resolved", zap.String("name", p.key.name), zap.String("other", p.key.claimant))
			}
		}
		m.mu.Unlock()
	}
}

// Conflict reports, while it lasts, that another member claims this
// node's name (nil when there is none, and on a nil Members): such a node
// is invisible to part of the cluster, so readiness checks fail on it.
func (m *Members) Conflict() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var msgs []string
	for k, cf := range m.conflicts {
		if cf.self {
			msgs = append(msgs, fmt.Sprintf("gossip name conflict: the member at %s also calls itself %q (this node is %s): give each process its own --node-name",
				k.claimant, k.name, cf.holder))
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	sort.Strings(msgs)
	errs := make([]error, len(msgs))
	for i, s := range msgs {
		errs[i] = errors.New(s)
	}
	return errors.Join(errs...)
}

func nodeAddr(n *memberlist.Node) string {
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}
