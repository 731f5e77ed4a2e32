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

// profilePackage holds the simulated engine's latency profiles: constants
// of the engine model only (docs/profiles.md).
const profilePackage = "test/enginesim/profile"

// policyRoots hold the routing policies and everything they are built on.
var policyRoots = []string{"picker", "sidecar", "internal"}

// moduleImports returns the packages of the module the non-test sources
// in dir import, remembering each directory's in seen.
func moduleImports(t *testing.T, dir string, seen map[string][]string) []string {
	t.Helper()
	if imps, ok := seen[dir]; ok {
		return imps
	}
	var imps []string
	for _, f := range sources(t, dir) {
		for path := range importsOf(f) {
			if rel, ok := strings.CutPrefix(path, module); ok && !slices.Contains(imps, rel) {
				imps = append(imps, rel)
			}
		}
	}
	slices.Sort(imps)
	seen[dir] = imps
	return imps
}

// importChain returns a shortest chain of imports (non-test sources) from
// the package in dir to the package target, dir and target included; nil
// when there is none.
func importChain(t *testing.T, dir, target string, seen map[string][]string) []string {
	t.Helper()
	from := map[string]string{dir: ""}
	queue := []string{dir}
	for len(queue) > 0 {
		at := queue[0]
		queue = queue[1:]
		if at == target {
			var chain []string
			for p := at; p != ""; p = from[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, imp := range moduleImports(t, at, seen) {
			if _, ok := from[imp]; !ok {
				from[imp] = at
				queue = append(queue, imp)
			}
		}
	}
	return nil
}

// TestPoliciesReadNoProfile: no package under picker/, sidecar/ or
// internal/ imports the engine's latency profiles, directly or through
// other packages (test files aside: a test may start an engine with a
// profile, or print a learned value beside the true one). A policy learns
// prefill rates, capacities and costs from what engines report and from
// probes, as real routers do; one that read the simulator's constants
// would win circularly (engine-profiles.md §1).
func TestPoliciesReadNoProfile(t *testing.T) {
	seen := map[string][]string{}
	checked := 0
	for _, root := range policyRoots {
		for _, dir := range packageDirs(t, root) {
			checked++
			if chain := importChain(t, dir, profilePackage, seen); chain != nil {
				t.Errorf("%s reaches the engine's latency profiles (%s): routing policies must learn from engine reports and probes, never read a profile", dir, strings.Join(chain, " → "))
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d package directories checked: the walk is broken", checked)
	}
	if _, err := os.Stat(filepath.Join(top, profilePackage)); err != nil {
		t.Fatalf("the profile package moved: %v (update the rule)", err)
	}
}

// TestProfileRuleBites: a planted import of the profile package is
// caught, directly and through the engine's scheduler, and a test file's
// is not held against its package.
func TestProfileRuleBites(t *testing.T) {
	dir := t.TempDir()
	rel := relToTop(t, dir)
	write := func(name, src string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.go", "package a\n\nimport _ \""+module+profilePackage+"\"\n")
	if got := importChain(t, rel, profilePackage, map[string][]string{}); len(got) != 2 || got[1] != profilePackage {
		t.Errorf("a direct import: chain %q", got)
	}
	write("a.go", "package a\n\nimport _ \""+module+"test/enginesim/sched\"\n")
	if got := importChain(t, rel, profilePackage, map[string][]string{}); len(got) != 3 || got[1] != "test/enginesim/sched" {
		t.Errorf("an import through the scheduler: chain %q", got)
	}
	if err := os.Rename(filepath.Join(dir, "a.go"), filepath.Join(dir, "a_test.go")); err != nil {
		t.Fatal(err)
	}
	write("b.go", "package a\n\nimport _ \""+module+"internal/blockkey\"\n")
	if got := importChain(t, rel, profilePackage, map[string][]string{}); got != nil {
		t.Errorf("a test file's import was held against the package: %q", got)
	}
}
