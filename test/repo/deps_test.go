package repo

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/kvroute/kvroute/"

// cores are the pure packages (DESIGN.md §3): no I/O, no clock reads, no
// randomness of their own, no logging. The list is explicit: a package
// joins it when it is written as a core, and the test fails if one of
// these is missing.
var cores = []string{
	"internal/blockkey",
	"internal/debugapi",
	"internal/identity",
	"internal/inject",
	"internal/kvevents",
	"internal/openai",
	"internal/summary",
	"internal/tier",
	"internal/verify",
	"picker/decide",
	"picker/extproc",
	"picker/fleet",
	"picker/inflight",
	"picker/peers",
	"picker/pickapi",
	"picker/predict",
	"picker/tenant",
	"picker/trust",
	"picker/score",
	"picker/standing",
	"sidecar/index",
	"sidecar/sequence",
	"sidecar/streamhealth",
	"test/enginesim/chat",
	"test/enginesim/kvcache",
	"test/enginesim/profile",
	"test/enginesim/sched",
	"test/enginesim/transfer",
	"test/lab/stats",
}

// helpers are the test/ packages that exist only for tests; the other
// test/ packages (test/enginesim and its parts: `kvroute engine`;
// test/bench: `kvroute bench` and `kvroute demo`) ship in the binary.
var helpers = []string{"test/e2e", "test/metrictest", "test/pod", "test/repo", "test/simsidecar", "test/testnet", "test/vectors"}

// forbidden are imports no core may have: the network, the file system
// and process, system calls, loggers, locks (a core is not safe for
// concurrent use: its shell serialises access), randomness sources, and
// the libraries that do I/O for the shells. Two parts of net are values
// only, parsing and comparing, and allowed: net/netip and net/url.
func forbidden(path string) bool {
	if path == "net/netip" || path == "net/url" {
		return false
	}
	for _, p := range []string{"net", "os", "syscall", "log", "sync", "math/rand", "crypto/rand", "io/ioutil", "os/exec",
		"go.uber.org/zap", "github.com/pebbe/zmq4", "google.golang.org/grpc", "google.golang.org/protobuf",
		"github.com/prometheus", "github.com/hashicorp/memberlist", module + "proto", module + "gossip"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// timeAllowed are the parts of package time a core may use: values and
// arithmetic on them. Reading the clock (Now, Since, Until), sleeping and
// timers (Sleep, After, AfterFunc, Tick, NewTimer, NewTicker) and loading
// zones from disk are the shell's; a core takes `now` as an argument.
var timeAllowed = []string{"Duration", "Time", "Nanosecond", "Microsecond", "Millisecond", "Second", "Minute", "Hour",
	"Unix", "UnixMilli", "UnixMicro", "Date", "UTC", "Month", "Weekday", "ParseDuration", "RFC3339", "RFC3339Nano"}

// sources parses the non-test Go files of a package directory.
func sources(t *testing.T, dir string) []*ast.File {
	t.Helper()
	_, files := parsedSources(t, dir)
	return files
}

// parsedSources is sources with the file set its positions are in.
func parsedSources(t *testing.T, dir string) (*token.FileSet, []*ast.File) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(top, dir))
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	var files []*ast.File
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(top, dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return fset, files
}

// relToTop is dir (a test's temporary directory) as the rules name
// package directories: relative to the repository's top, slash-separated.
func relToTop(t *testing.T, dir string) string {
	t.Helper()
	absTop, err := filepath.Abs(top)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(absTop, dir)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.ToSlash(rel)
}

// importsOf lists a file's imports with the name each is used under.
func importsOf(f *ast.File) map[string]string {
	out := map[string]string{}
	for _, im := range f.Imports {
		path, _ := strconv.Unquote(im.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		out[path] = name
	}
	return out
}

// coreProblems lists what makes the package in dir not a pure core.
func coreProblems(t *testing.T, dir string) []string {
	var problems []string
	files := sources(t, dir)
	if len(files) == 0 {
		return []string{dir + ": no Go files (remove it from the list of cores, or restore it)"}
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n.(type) {
			case *ast.GoStmt:
				problems = append(problems, dir+" starts a goroutine")
			case *ast.ChanType:
				problems = append(problems, dir+" uses a channel")
			}
			return true
		})
		imports := importsOf(f)
		for path, name := range imports {
			switch {
			case forbidden(path):
				problems = append(problems, dir+" imports "+path)
			case strings.HasPrefix(path, module) && !slices.Contains(cores, strings.TrimPrefix(path, module)):
				problems = append(problems, dir+" imports "+path+", which is not a core")
			case path == "time":
				ast.Inspect(f, func(n ast.Node) bool {
					sel, ok := n.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == name && !slices.Contains(timeAllowed, sel.Sel.Name) {
						problems = append(problems, dir+" uses time."+sel.Sel.Name)
					}
					return true
				})
			}
		}
	}
	return problems
}

// TestCoresArePure: every core imports no I/O, clock, lock, randomness or
// logger, starts no goroutine, and depends on cores only; and every
// package under internal/ is one (DESIGN.md §3: internal/ holds the pure
// packages shared by several components).
func TestCoresArePure(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join(top, "internal"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !slices.Contains(cores, "internal/"+e.Name()) {
			t.Errorf("internal/%s is not listed as a pure core: make it one (and list it), or move it out of internal/", e.Name())
		}
	}
	for _, dir := range cores {
		for _, p := range coreProblems(t, dir) {
			t.Error(p)
		}
	}
}

// TestProductCodeImportsNoTestHelper: nothing that ships (every package
// but the test helpers; test files aside) imports a test helper package.
func TestProductCodeImportsNoTestHelper(t *testing.T) {
	var dirs []string
	err := filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(top, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" || slices.Contains(helpers, filepath.ToSlash(rel)) {
				return filepath.SkipDir
			}
			dirs = append(dirs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, dir := range dirs {
		files := sources(t, dir)
		if len(files) > 0 {
			checked++
		}
		for _, p := range helperImports(dir, files) {
			t.Error(p)
		}
	}
	if checked < 20 {
		t.Fatalf("only %d packages found to check: the walk is broken", checked)
	}
	for _, h := range helpers {
		if _, err := os.Stat(filepath.Join(top, h)); err != nil {
			t.Errorf("test helper %s: %v (update the list)", h, err)
		}
	}
}

// helperImports lists the test helper packages files import.
func helperImports(dir string, files []*ast.File) []string {
	var out []string
	for _, f := range files {
		for path := range importsOf(f) {
			if rel, ok := strings.CutPrefix(path, module); ok && slices.Contains(helpers, rel) {
				out = append(out, dir+" (ships) imports the test helper "+rel)
			}
		}
	}
	return out
}

// TestPurityRulesBite: the rules catch what they are for, on sources
// written here (a rule that cannot fail protects nothing).
func TestPurityRulesBite(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.go", `package a

import (
	"net/http"
	clock "time"

	"github.com/kvroute/kvroute/picker/fleetview"
	"go.uber.org/zap"
)

var _ = http.StatusOK
var _ *fleetview.View
var _ *zap.Logger

func f(d clock.Duration, t clock.Time) clock.Time { return clock.Now().Add(d) }

func g() { go f(0, clock.Time{}) }
`)
	write("a_test.go", "package a\n\nimport \"os\"\n\nvar _ = os.Args\n")
	rel := relToTop(t, dir)
	got := coreProblems(t, rel)
	want := []string{"imports net/http", "imports go.uber.org/zap", "picker/fleetview, which is not a core", "uses time.Now", "starts a goroutine"}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, w) }) {
			t.Errorf("the rules missed %q: %q", w, got)
		}
	}
	if slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, "imports os") }) {
		t.Errorf("a test file's import was held against the package: %q", got)
	}
	write("b.go", "package a\n\nimport testpod \"github.com/kvroute/kvroute/test/pod\"\n\nvar _ testpod.Options\n")
	if got := helperImports("x", sources(t, rel)); len(got) != 1 || !strings.Contains(got[0], "test/pod") {
		t.Errorf("product code importing test/pod: %q", got)
	}
	if slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, "time.Duration") || strings.Contains(p, "time.Time") }) {
		t.Errorf("value types of package time were refused: %q", got)
	}
}
