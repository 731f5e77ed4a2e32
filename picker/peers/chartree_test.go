package peers

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"
)

// ctCheck reports the first broken invariant of tree: per-tenant counts
// and the total equal a walk, every node is owned, ownership is
// prefix-closed, each stamp counts the children its tenant owns, labels
// are non-empty valid UTF-8, children are sorted by distinct first runes
// and point back to their parent. It recurses on its own (not through
// walk, which it checks too).
func ctCheck(tree *charTree) error {
	walked := map[string]int{}
	var err error
	var visit func(n *ctNode)
	visit = func(n *ctNode) {
		for i, c := range n.children {
			switch {
			case c.parent != n:
				err = fmt.Errorf("node %q: wrong parent", c.label)
			case c.label == "" || !utf8.ValidString(c.label):
				err = fmt.Errorf("node %q: empty or invalid label", c.label)
			case c.runes != utf8.RuneCountInString(c.label):
				err = fmt.Errorf("node %q: runes %d", c.label, c.runes)
			case len(c.stamps) == 0:
				err = fmt.Errorf("node %q: no owner", c.label)
			case i > 0 && ctFirstRune(n.children[i-1].label) >= ctFirstRune(c.label):
				err = fmt.Errorf("node %q: children unsorted", c.label)
			case !slices.IsSortedFunc(c.stamps, func(a, b ctStamp) int { return strings.Compare(a.tenant, b.tenant) }):
				err = fmt.Errorf("node %q: stamps unsorted", c.label)
			}
			for _, s := range c.stamps {
				kids := 0
				for _, g := range c.children {
					if _, ok := g.stampIndex(s.tenant); ok {
						kids++
					}
				}
				if int(s.kids) != kids {
					err = fmt.Errorf("node %q: %s's kids %d, owns %d", c.label, s.tenant, s.kids, kids)
				}
				walked[s.tenant] += c.runes
				if _, ok := n.stampIndex(s.tenant); n.parent != nil && !ok {
					err = fmt.Errorf("node %q: %s owns it, not its parent", c.label, s.tenant)
				}
			}
			visit(c)
		}
	}
	visit(tree.root)
	if err != nil {
		return err
	}
	nodes := 0
	tree.walk(func(*ctNode) bool { nodes++; return true })
	if nodes != ctCount(tree.root)-1 {
		return fmt.Errorf("walk visited %d nodes of %d", nodes, ctCount(tree.root)-1)
	}
	sum := 0
	for tenant, n := range walked {
		sum += n
		if tree.chars[tenant] != n {
			return fmt.Errorf("tenant %s: counted %d, walk %d", tenant, tree.chars[tenant], n)
		}
	}
	if len(tree.chars) != len(walked) || tree.total != sum {
		return fmt.Errorf("counts %v total %d, walk %v total %d", tree.chars, tree.total, walked, sum)
	}
	return nil
}

// ctCount counts n and the nodes below it.
func ctCount(n *ctNode) int {
	c := 1
	for _, k := range n.children {
		c += ctCount(k)
	}
	return c
}

// ctLabels lists the tree's edges depth first, as "label[tenants]".
func ctLabels(tree *charTree) []string {
	var out []string
	tree.walk(func(n *ctNode) bool {
		var ts []string
		for _, s := range n.stamps {
			ts = append(ts, s.tenant)
		}
		out = append(out, n.label+"["+strings.Join(ts, ",")+"]")
		return true
	})
	return out
}

func TestCharTreeInsertMatchSplit(t *testing.T) {
	type ins struct{ text, tenant string }
	type match struct {
		text    string
		matched int
		tenants []string
	}
	for _, tc := range []struct {
		name    string
		inserts []ins
		labels  []string
		chars   map[string]int
		matches []match
	}{{
		name:    "one text",
		inserts: []ins{{"héllo wörld", "A"}},
		labels:  []string{"héllo wörld[A]"},
		chars:   map[string]int{"A": 11},
		matches: []match{
			{"héllo", 5, []string{"A"}},
			{"héllo wörld!", 11, []string{"A"}},
			{"hallo", 1, []string{"A"}},
			{"xyz", 0, nil},
			{"", 0, nil},
		},
	}, {
		name:    "split at a shared prefix",
		inserts: []ins{{"héllo wörld", "A"}, {"héllo 世界", "B"}},
		labels:  []string{"héllo [A,B]", "wörld[A]", "世界[B]"},
		chars:   map[string]int{"A": 11, "B": 8},
		matches: []match{
			{"héllo", 5, []string{"A", "B"}},
			{"héllo ", 6, []string{"A", "B"}},
			{"héllo w", 7, []string{"A"}},
			{"héllo 世界人", 8, []string{"B"}},
			{"héllo 世", 7, []string{"B"}},
		},
	}, {
		// é and è share their first byte: the split must not cut a rune.
		name:    "runes sharing a leading byte",
		inserts: []ins{{"aé", "A"}, {"aè", "B"}},
		labels:  []string{"a[A,B]", "è[B]", "é[A]"},
		chars:   map[string]int{"A": 2, "B": 2},
		matches: []match{
			{"aè", 2, []string{"B"}},
			{"aé", 2, []string{"A"}},
			{"aê", 1, []string{"A", "B"}},
		},
	}, {
		name:    "same text, two tenants",
		inserts: []ins{{"prompt", "A"}, {"prompt", "B"}},
		labels:  []string{"prompt[A,B]"},
		chars:   map[string]int{"A": 6, "B": 6},
		matches: []match{{"prompt and more", 6, []string{"A", "B"}}},
	}, {
		name:    "a prefix of an edge inserted",
		inserts: []ins{{"abcdef", "A"}, {"abc", "B"}},
		labels:  []string{"abc[A,B]", "def[A]"},
		chars:   map[string]int{"A": 6, "B": 3},
		matches: []match{{"abc", 3, []string{"A", "B"}}, {"abcd", 4, []string{"A"}}},
	}, {
		name:    "an extension of an edge inserted",
		inserts: []ins{{"abc", "A"}, {"abcdef", "B"}},
		labels:  []string{"abc[A,B]", "def[B]"},
		chars:   map[string]int{"A": 3, "B": 6},
		matches: []match{{"abcdefg", 6, []string{"B"}}},
	}, {
		// A walk that leaves an edge partway stops there, though the rest
		// of the query would match that node's child.
		name:    "no match past a divergence",
		inserts: []ins{{"abcd", "A"}, {"abcdXY", "B"}},
		labels:  []string{"abcd[A,B]", "XY[B]"},
		chars:   map[string]int{"A": 4, "B": 6},
		matches: []match{{"abXY", 2, []string{"A", "B"}}, {"abcdXYZ", 6, []string{"B"}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tree := newCharTree()
			for _, in := range tc.inserts {
				tree.Insert(in.text, in.tenant, 1)
			}
			if err := ctCheck(tree); err != nil {
				t.Fatal(err)
			}
			if got := ctLabels(tree); !slices.Equal(got, tc.labels) {
				t.Errorf("labels %q, want %q", got, tc.labels)
			}
			total := 0
			for tenant, want := range tc.chars {
				total += want
				if got := tree.TenantChars(tenant); got != want {
					t.Errorf("%s owns %d chars, want %d", tenant, got, want)
				}
			}
			if tree.Total() != total {
				t.Errorf("total %d, want %d", tree.Total(), total)
			}
			for _, m := range tc.matches {
				n, tenants := tree.Match(m.text)
				if n != m.matched || !slices.Equal(tenants, m.tenants) {
					t.Errorf("Match(%q) = %d %q, want %d %q", m.text, n, tenants, m.matched, m.tenants)
				}
			}
		})
	}
}

func TestCharTreeEdgesOwnTheirMemory(t *testing.T) {
	// No label may point into a request's text (it would pin all of it),
	// nor into a split edge's old allocation.
	text := strings.Repeat("x", 1000) + "tail"
	tree := newCharTree()
	tree.Insert(text, "A", 1)
	tree.Insert(text[:500]+"y", "B", 1)
	tree.Insert(text[:250]+"z", "C", 1)
	start := uintptr(unsafe.Pointer(unsafe.StringData(text)))
	seen := map[uintptr]bool{}
	tree.walk(func(n *ctNode) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(n.label)))
		if p >= start && p < start+uintptr(len(text)) {
			t.Errorf("label %.10q… points into the request text", n.label)
		}
		if seen[p] {
			t.Errorf("label %.10q… shares an allocation", n.label)
		}
		seen[p] = true
		return true
	})
	if len(seen) != 5 {
		t.Errorf("%d edges, want 5: %q", len(seen), ctLabels(tree))
	}
}

func TestSGLTextInvalidUTF8(t *testing.T) {
	for _, tc := range []struct {
		in    string
		runes int
	}{{"abc", 3}, {"\xff\xfe", 2}, {"a\xe2\x82", 3}, {"€", 1}} {
		got := sglText(tc.in)
		if !utf8.ValidString(got) || utf8.RuneCountInString(got) != tc.runes {
			t.Errorf("sglText(%q) = %q, want %d valid runes", tc.in, got, tc.runes)
		}
	}
}

func TestCharTreeEvictLRU(t *testing.T) {
	// A: "abc"+"def" at 1; B: "abc"+"xyz" at 2; A: "qrst" at 3. Leaves
	// go oldest first: A/def (1), then A/abc (1, a leaf of A's once def
	// is gone), B/xyz (2), B/abc (2), A/qrst (3).
	build := func() *charTree {
		tree := newCharTree()
		tree.Insert("abcdef", "A", 1)
		tree.Insert("abcxyz", "B", 2)
		tree.Insert("qrst", "A", 3)
		return tree
	}
	for _, tc := range []struct {
		budget int
		labels []string
		chars  map[string]int
	}{
		{budget: 16, labels: []string{"abc[A,B]", "def[A]", "xyz[B]", "qrst[A]"}, chars: map[string]int{"A": 10, "B": 6}},
		{budget: 15, labels: []string{"abc[A,B]", "xyz[B]", "qrst[A]"}, chars: map[string]int{"A": 7, "B": 6}},
		{budget: 13, labels: []string{"abc[A,B]", "xyz[B]", "qrst[A]"}, chars: map[string]int{"A": 7, "B": 6}},
		{budget: 12, labels: []string{"abc[B]", "xyz[B]", "qrst[A]"}, chars: map[string]int{"A": 4, "B": 6}},
		{budget: 10, labels: []string{"abc[B]", "xyz[B]", "qrst[A]"}, chars: map[string]int{"A": 4, "B": 6}},
		{budget: 9, labels: []string{"abc[B]", "qrst[A]"}, chars: map[string]int{"A": 4, "B": 3}},
		{budget: 4, labels: []string{"qrst[A]"}, chars: map[string]int{"A": 4}},
		{budget: 3, labels: nil, chars: map[string]int{}},
		{budget: 0, labels: nil, chars: map[string]int{}},
	} {
		t.Run(fmt.Sprint(tc.budget), func(t *testing.T) {
			tree := build()
			tree.Evict(tc.budget)
			if err := ctCheck(tree); err != nil {
				t.Fatal(err)
			}
			if got := ctLabels(tree); !slices.Equal(got, tc.labels) {
				t.Errorf("labels %q, want %q", got, tc.labels)
			}
			for _, tenant := range []string{"A", "B"} {
				if got := tree.TenantChars(tenant); got != tc.chars[tenant] {
					t.Errorf("%s owns %d, want %d", tenant, got, tc.chars[tenant])
				}
			}
			if tree.Total() > tc.budget {
				t.Errorf("total %d over budget %d", tree.Total(), tc.budget)
			}
		})
	}
}

func TestCharTreeEvictTiesAreFixed(t *testing.T) {
	// Equal stamps: the tenant name decides, then the node's age.
	tree := newCharTree()
	tree.Insert("ab", "B", 5)
	tree.Insert("cd", "A", 5)
	tree.Insert("ef", "A", 5)
	tree.Evict(4)
	if got, want := ctLabels(tree), []string{"ab[B]", "ef[A]"}; !slices.Equal(got, want) {
		t.Errorf("labels %q, want %q", got, want)
	}
}

func TestCharTreeRemove(t *testing.T) {
	tree := newCharTree()
	tree.Insert("abcdef", "A", 1)
	tree.Insert("abcxyz", "B", 2)
	tree.Insert("qrst", "A", 3)
	tree.Remove("A")
	if err := ctCheck(tree); err != nil {
		t.Fatal(err)
	}
	if got, want := ctLabels(tree), []string{"abc[B]", "xyz[B]"}; !slices.Equal(got, want) {
		t.Errorf("labels %q, want %q", got, want)
	}
	if tree.TenantChars("A") != 0 || tree.Total() != 6 {
		t.Errorf("A %d total %d, want 0 and 6", tree.TenantChars("A"), tree.Total())
	}
	tree.Remove("nobody")
	tree.Remove("B")
	if err := ctCheck(tree); err != nil || len(tree.root.children) != 0 || tree.Total() != 0 {
		t.Errorf("after removing all: %v, %q, total %d", err, ctLabels(tree), tree.Total())
	}
}

func TestCharTreeDeepChain(t *testing.T) {
	// A conversation growing turn by turn makes a chain one node per turn.
	tree := newCharTree()
	const turns = 3000
	text := ""
	for i := range turns {
		text += "t "
		tree.Insert(text, "A", int64(i))
	}
	tree.Insert(text[:10]+"B", "B", turns)
	if err := ctCheck(tree); err != nil {
		t.Fatal(err)
	}
	if n := ctCount(tree.root) - 1; n != turns+1 {
		t.Fatalf("%d nodes, want %d", n, turns+1)
	}
	// 11 characters over: A's 6 deepest turns (2 each) go, the oldest
	// leaves; B's is the newest.
	tree.Evict(2 * turns)
	if err := ctCheck(tree); err != nil {
		t.Fatal(err)
	}
	if tree.Total() != 2*turns-1 || tree.TenantChars("B") != 11 {
		t.Errorf("total %d B %d, want %d and 11", tree.Total(), tree.TenantChars("B"), 2*turns-1)
	}
	if m, _ := tree.Match(text); m != 2*(turns-6) {
		t.Errorf("A's text matches %d runes, want %d", m, 2*(turns-6))
	}
	tree.Remove("A")
	if err := ctCheck(tree); err != nil || tree.Total() != 11 {
		t.Errorf("after Remove: %v, total %d", err, tree.Total())
	}
}

// FuzzCharTree drives a tree with random inserts, matches, evictions and
// removals over a small alphabet with multibyte runes: nothing panics, the
// invariants (ctCheck) hold after every step, a text just inserted
// matches in full with its tenant among the owners, and an eviction meets
// its budget.
func FuzzCharTree(f *testing.F) {
	f.Add([]byte("\x00\x01abc\x00\x02abd\x03\x05"))
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte("\x00\x00\xff\xfe\x10\x00\x01\xc3\xa9\x02\x00"))
	alphabet := []string{"a", "b", "é", "è", "世", "界", " ", "\xff"}
	f.Fuzz(func(t *testing.T, ops []byte) {
		tree := newCharTree()
		at := int64(0)
		for len(ops) >= 2 {
			op, arg := ops[0], ops[1]
			ops = ops[2:]
			tenant := string(rune('A' + arg%3))
			n := min(int(arg>>2), len(ops))
			var sb strings.Builder
			for _, b := range ops[:n] {
				sb.WriteString(alphabet[b%byte(len(alphabet))])
			}
			text := sglText(sb.String())
			at++
			switch op % 4 {
			case 0:
				ops = ops[n:]
				tree.Insert(text, tenant, at)
				matched, tenants := tree.Match(text)
				if matched != utf8.RuneCountInString(text) || text != "" && !slices.Contains(tenants, tenant) {
					t.Fatalf("after inserting %q for %s: matched %d, owners %q", text, tenant, matched, tenants)
				}
			case 1:
				ops = ops[n:]
				if matched, _ := tree.Match(text); matched > utf8.RuneCountInString(text) {
					t.Fatalf("Match(%q) = %d", text, matched)
				}
			case 2:
				budget := int(arg) % 16
				tree.Evict(budget)
				if tree.Total() > budget {
					t.Fatalf("Evict(%d) left %d", budget, tree.Total())
				}
			case 3:
				tree.Remove(tenant)
				if tree.TenantChars(tenant) != 0 {
					t.Fatalf("Remove(%s) left %d", tenant, tree.TenantChars(tenant))
				}
			}
			if err := ctCheck(tree); err != nil {
				t.Fatal(err)
			}
		}
	})
}
