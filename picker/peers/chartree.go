package peers

import (
	"container/heap"
	"slices"
	"strings"
	"unicode/utf8"
)

// charTree is an approximate multi-tenant radix tree over characters
// (runes), the cache model of SMG's HTTP mode: every tenant (an endpoint)
// that was sent a text owns the nodes along that text's path, with the
// time it last did (its LRU stamp there). Edges are strings split on
// insert at rune boundaries; texts are valid UTF-8 (sglText).
//
// Ownership is prefix-closed: a tenant owning a node owns its ancestors
// (an insert stamps the whole path, eviction only takes a tenant's
// leaves, Remove takes a tenant everywhere), so a node no tenant owns has
// no children and is dropped at once.
//
// chars counts, per tenant, the characters of the nodes it owns; total is
// their sum (a node shared by k tenants counts k times): the figure the
// eviction budget bounds, known without a walk.
type charTree struct {
	root  *ctNode
	chars map[string]int
	total int
	seq   uint64 // node ids, for deterministic eviction ties
}

// ctNode is one edge of the tree and the node it ends at.
type ctNode struct {
	label    string // its own allocation (never a slice of a request's text)
	runes    int    // utf8.RuneCountInString(label)
	id       uint64
	parent   *ctNode
	children []*ctNode // sorted by first rune, which is distinct
	stamps   []ctStamp // sorted by tenant
}

// ctStamp is a tenant's ownership of a node and its last access there.
type ctStamp struct {
	tenant string
	at     int64 // UnixNano
	kids   int32 // children of the node the tenant owns; 0: its leaf
}

func newCharTree() *charTree {
	return &charTree{root: &ctNode{}, chars: map[string]int{}}
}

// Total is the characters the tenants own, summed over tenants.
func (t *charTree) Total() int { return t.total }

// TenantChars is the characters tenant owns.
func (t *charTree) TenantChars(tenant string) int { return t.chars[tenant] }

// Insert adds text under tenant, stamping every node on its path with at.
func (t *charTree) Insert(text, tenant string, at int64) {
	n, rest := t.root, text
	for rest != "" {
		c := n.child(ctFirstRune(rest))
		if c == nil {
			leaf := t.newNode(strings.Clone(rest))
			n.addChild(leaf)
			t.stamp(leaf, tenant, at)
			return
		}
		k := ctCommonPrefix(c.label, rest)
		if k < len(c.label) {
			c = t.split(c, k)
		}
		t.stamp(c, tenant, at)
		n, rest = c, rest[k:]
	}
}

// Match walks text down the tree: matched is how many of its runes the
// tree holds from the start, tenants the owners of the deepest node the
// walk reached (partly or wholly); nil when no rune matched.
func (t *charTree) Match(text string) (matched int, tenants []string) {
	n, rest := t.root, text
	for rest != "" {
		c := n.child(ctFirstRune(rest))
		if c == nil {
			break
		}
		k := ctCommonPrefix(c.label, rest)
		matched += utf8.RuneCountInString(rest[:k])
		n = c
		if k < len(c.label) {
			break
		}
		rest = rest[k:]
	}
	for _, s := range n.stamps {
		tenants = append(tenants, s.tenant)
	}
	return matched, tenants
}

// newNode makes a detached node for label.
func (t *charTree) newNode(label string) *ctNode {
	t.seq++
	return &ctNode{label: label, runes: utf8.RuneCountInString(label), id: t.seq}
}

// stamp records tenant's access to n at at, counting n's characters to it
// if it did not own n.
func (t *charTree) stamp(n *ctNode, tenant string, at int64) {
	i, ok := n.stampIndex(tenant)
	if ok {
		n.stamps[i].at = at
		return
	}
	n.stamps = slices.Insert(n.stamps, i, ctStamp{tenant: tenant, at: at})
	t.chars[tenant] += n.runes
	t.total += n.runes
	t.countKid(n, tenant, +1)
}

// unstamp drops tenant's ownership of n (which it has) and its count.
func (t *charTree) unstamp(n *ctNode, tenant string) {
	i, _ := n.stampIndex(tenant)
	n.stamps = slices.Delete(n.stamps, i, i+1)
	t.chars[tenant] -= n.runes
	t.total -= n.runes
	if t.chars[tenant] == 0 {
		delete(t.chars, tenant)
	}
	t.countKid(n, tenant, -1)
}

// countKid adds d to the count of tenant's children at n's parent, which
// tenant owns (ownership is prefix-closed); the root keeps no stamps.
func (t *charTree) countKid(n *ctNode, tenant string, d int32) {
	if p := n.parent; p != t.root {
		i, _ := p.stampIndex(tenant)
		p.stamps[i].kids += d
	}
}

// split cuts c's edge after k bytes (a rune boundary inside it): a new
// node takes the first part and c's owners, c keeps the rest under it.
// It returns the new node. Both parts get their own allocation, so an
// evicted part pins no memory.
func (t *charTree) split(c *ctNode, k int) *ctNode {
	mid := t.newNode(strings.Clone(c.label[:k]))
	mid.stamps = slices.Clone(c.stamps)
	for i := range mid.stamps {
		mid.stamps[i].kids = 1 // c, which the same tenants own
	}
	p := c.parent
	i, _ := p.childIndex(ctFirstRune(c.label))
	p.children[i], mid.parent = mid, p
	c.label = strings.Clone(c.label[k:])
	c.runes -= mid.runes
	mid.addChild(c)
	return mid
}

// Remove drops tenant from every node, and the nodes left unowned.
func (t *charTree) Remove(tenant string) {
	var owned []*ctNode
	t.walk(func(n *ctNode) bool {
		_, ok := n.stampIndex(tenant)
		if ok {
			owned = append(owned, n)
		}
		return ok
	})
	for _, n := range slices.Backward(owned) { // children before parents
		p := n.parent
		t.unstamp(n, tenant)
		if len(n.stamps) == 0 {
			p.removeChild(n)
		}
	}
}

// Evict takes tenants' leaves, least recently used first across all
// tenants, until Total is at most budget (or nothing is left).
func (t *charTree) Evict(budget int) {
	if t.total <= budget {
		return
	}
	h := &ctLeaves{}
	t.walk(func(n *ctNode) bool {
		for _, s := range n.stamps {
			if s.kids == 0 {
				h.items = append(h.items, ctLeaf{n: n, tenant: s.tenant, at: s.at})
			}
		}
		return true
	})
	heap.Init(h)
	for t.total > budget && h.Len() > 0 {
		l := heap.Pop(h).(ctLeaf)
		p := l.n.parent
		t.unstamp(l.n, l.tenant)
		if len(l.n.stamps) == 0 {
			p.removeChild(l.n)
		}
		if p == t.root {
			continue
		}
		if i, _ := p.stampIndex(l.tenant); p.stamps[i].kids == 0 {
			heap.Push(h, ctLeaf{n: p, tenant: l.tenant, at: p.stamps[i].at})
		}
	}
}

// walk calls f on every node below the root, depth first in child order,
// descending below a node only when f returns true. It keeps its own
// stack: a long conversation's chain of turns can be deep.
func (t *charTree) walk(f func(*ctNode) bool) {
	stack := []*ctNode{t.root}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if n != t.root && !f(n) {
			continue
		}
		for _, c := range slices.Backward(n.children) {
			stack = append(stack, c)
		}
	}
}

// child is n's child whose label starts with r, or nil.
func (n *ctNode) child(r rune) *ctNode {
	if i, ok := n.childIndex(r); ok {
		return n.children[i]
	}
	return nil
}

// childIndex finds the child starting with r, or where it would go.
func (n *ctNode) childIndex(r rune) (int, bool) {
	return slices.BinarySearchFunc(n.children, r, func(c *ctNode, r rune) int {
		return int(ctFirstRune(c.label)) - int(r)
	})
}

// addChild links c under n (no child of n starts with c's first rune).
func (n *ctNode) addChild(c *ctNode) {
	i, _ := n.childIndex(ctFirstRune(c.label))
	n.children = slices.Insert(n.children, i, c)
	c.parent = n
}

// removeChild unlinks c from n.
func (n *ctNode) removeChild(c *ctNode) {
	if i, ok := n.childIndex(ctFirstRune(c.label)); ok {
		n.children = slices.Delete(n.children, i, i+1)
		c.parent = nil
	}
}

// stampIndex finds tenant's stamp on n, or where it would go.
func (n *ctNode) stampIndex(tenant string) (int, bool) {
	return slices.BinarySearchFunc(n.stamps, tenant, func(s ctStamp, t string) int {
		return strings.Compare(s.tenant, t)
	})
}

// ctLeaf is a tenant's leaf: a node it owns and none of whose children it
// owns, with its stamp there.
type ctLeaf struct {
	n      *ctNode
	tenant string
	at     int64
}

// ctLeaves is a min-heap of leaves: oldest stamp first, then tenant, then
// node id, so equal stamps evict in a fixed order.
type ctLeaves struct{ items []ctLeaf }

func (h *ctLeaves) Len() int      { return len(h.items) }
func (h *ctLeaves) Swap(i, j int) { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *ctLeaves) Push(x any)    { h.items = append(h.items, x.(ctLeaf)) }

func (h *ctLeaves) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	if a.at != b.at {
		return a.at < b.at
	}
	if a.tenant != b.tenant {
		return a.tenant < b.tenant
	}
	return a.n.id < b.n.id
}

func (h *ctLeaves) Pop() any {
	last := h.items[len(h.items)-1]
	h.items[len(h.items)-1] = ctLeaf{}
	h.items = h.items[:len(h.items)-1]
	return last
}

// ctFirstRune is s's first rune (utf8.RuneError for "").
func ctFirstRune(s string) rune {
	r, _ := utf8.DecodeRuneInString(s)
	return r
}

// ctCommonPrefix is the byte length of a's and b's longest common prefix
// of whole runes (both valid UTF-8).
func ctCommonPrefix(a, b string) int {
	n := min(len(a), len(b))
	k := 0
	for k < n && a[k] == b[k] {
		k++
	}
	for k > 0 && (ctMidRune(a, k) || ctMidRune(b, k)) {
		k--
	}
	return k
}

// ctMidRune reports whether byte k of s is inside a rune, not at its start.
func ctMidRune(s string, k int) bool { return k < len(s) && !utf8.RuneStart(s[k]) }

// sglText is s as valid UTF-8: each invalid byte becomes U+FFFD, as a
// conversion to []rune reads it, so one rune is one character.
func sglText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string([]rune(s))
}
