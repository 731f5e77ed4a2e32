package repo

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// boundary is a rule between components: no shipping package under from
// imports a package under to, except the packages in except, for reason.
type boundary struct {
	from, to string
	except   []string
	reason   string
}

// boundaries are the component rules (DESIGN.md §3; the guide: a
// component does not import another component; shared shells live in
// their own package). Test files are not held to them: a test may start
// another component to talk to (picker tests start sidecars).
var boundaries = []boundary{
	{from: "sidecar", to: "picker",
		reason: "the sidecar and the picker are sibling components: what both need is a core under internal/ or a shared shell under gossip/ (gossip/secretfile), never the other's package"},
	{from: "picker", to: "sidecar", except: []string{"picker/localfleet"},
		reason: "the picker learns what sidecars hold only from their streams (picker/fleetview); only the in-process fleet, picker/localfleet, runs the sidecar's own cores (sidecar/index) in the picker's process, for tests and the lab"},
}

// packageDirs lists the directories under root (relative to the
// repository's top) holding Go packages.
func packageDirs(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(filepath.Join(top, root), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() {
			rel, _ := filepath.Rel(top, path)
			dirs = append(dirs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// crossings lists the imports of the package in dir (its non-test
// sources) that break b.
func crossings(t *testing.T, dir string, b boundary) []string {
	t.Helper()
	if slices.ContainsFunc(b.except, func(e string) bool { return dir == e || strings.HasPrefix(dir, e+"/") }) {
		return nil
	}
	var out []string
	for _, f := range sources(t, dir) {
		for path := range importsOf(f) {
			rel, ok := strings.CutPrefix(path, module)
			if ok && (rel == b.to || strings.HasPrefix(rel, b.to+"/")) {
				out = append(out, dir+" imports "+rel+": "+b.reason)
			}
		}
	}
	return out
}

// TestComponentBoundaries: the sidecar imports nothing from picker/, and
// the picker nothing from sidecar/ outside the in-process fleet.
func TestComponentBoundaries(t *testing.T) {
	for _, b := range boundaries {
		dirs := packageDirs(t, b.from)
		if len(dirs) < 3 {
			t.Fatalf("%s: only %d package directories found: the walk is broken", b.from, len(dirs))
		}
		for _, dir := range dirs {
			for _, p := range crossings(t, dir, b) {
				t.Error(p)
			}
		}
	}
}

// TestBoundariesBite: each rule catches a planted violation, and lets
// its exception and test files through.
func TestBoundariesBite(t *testing.T) {
	for _, b := range boundaries {
		dir := t.TempDir()
		src := "package a\n\nimport _ \"" + module + b.to + "/somepkg\"\n"
		if err := os.WriteFile(filepath.Join(dir, "a.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		rel := relToTop(t, dir)
		got := crossings(t, rel, b)
		if len(got) != 1 || !strings.Contains(got[0], b.reason) {
			t.Errorf("%s → %s: a planted import was not caught with its reason: %q", b.from, b.to, got)
		}
		if err := os.Rename(filepath.Join(dir, "a.go"), filepath.Join(dir, "a_test.go")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "b.go"), []byte("package a\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := crossings(t, rel, b); len(got) != 0 {
			t.Errorf("%s → %s: a test file's import was held against the package: %q", b.from, b.to, got)
		}
		for _, e := range b.except {
			if err := os.WriteFile(filepath.Join(dir, "b.go"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := crossings(t, e, boundary{from: b.from, to: b.to, except: b.except, reason: b.reason}); len(got) != 0 {
				t.Errorf("the exception %s was refused: %q", e, got)
			}
		}
	}
}
