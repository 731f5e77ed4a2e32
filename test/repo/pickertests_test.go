package repo

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// maxPickerPodTests bounds the tests of package picker that start the
// real pipeline — an engine with its sidecar (test/pod), a sidecar, a
// simulated sidecar streaming over gRPC, or a whole picker Server — (issue
// 33): the rest run on the in-process fleet (picker/localfleet), whose
// engines feed it through their event sink, without ZMQ, sidecar or stream.
const maxPickerPodTests = 15

// pipelineStarts are the calls that start the real pipeline.
var pipelineStarts = []string{"testpod.Start", "sidecar.Start", "simsidecar.Start", "picker.Start"}

// testsReaching lists the Test functions of the test files in dir whose
// calls reach one of calls (package.Func selectors), through the
// package's own helpers and methods, transitively.
func testsReaching(t *testing.T, dir string, calls []string) (reaching []string, tests int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(top, dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	funcs := map[string]*ast.FuncDecl{} // name, methods as ".name"
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				key := fd.Name.Name
				if fd.Recv != nil {
					key = "." + key
				}
				funcs[key] = fd
			}
		}
	}
	memo := map[string]bool{}
	var reaches func(name string, seen map[string]bool) bool
	reaches = func(name string, seen map[string]bool) bool {
		if v, ok := memo[name]; ok {
			return v
		}
		fd := funcs[name]
		if fd == nil || seen[name] {
			return false
		}
		seen[name] = true
		found := false
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok || found {
				return !found
			}
			switch fn := c.Fun.(type) {
			case *ast.SelectorExpr:
				if x, ok := fn.X.(*ast.Ident); ok && slices.Contains(calls, x.Name+"."+fn.Sel.Name) {
					found = true
				} else {
					found = reaches("."+fn.Sel.Name, seen)
				}
			case *ast.Ident:
				found = reaches(fn.Name, seen)
			}
			return !found
		})
		memo[name] = found
		return found
	}
	for name := range funcs {
		if !strings.HasPrefix(name, "Test") {
			continue
		}
		tests++
		if reaches(name, map[string]bool{}) {
			reaching = append(reaching, name)
		}
	}
	sort.Strings(reaching)
	return reaching, tests
}

// TestPickerTestsStayInProcess: at most maxPickerPodTests tests of
// package picker start the real pipeline.
func TestPickerTestsStayInProcess(t *testing.T) {
	pods, tests := testsReaching(t, "picker", pipelineStarts)
	if tests < 50 {
		t.Fatalf("only %d tests found in picker: the walk is broken", tests)
	}
	t.Logf("%d of %d picker tests start the real pipeline: %s", len(pods), tests, strings.Join(pods, " "))
	if len(pods) > maxPickerPodTests {
		t.Errorf("%d picker tests start engines with sidecars, sidecars or servers (at most %d): move those that do not test sockets, gossip or streams to the in-process fleet (startFleet)", len(pods), maxPickerPodTests)
	}
}

// TestPipelineStartsSeen: the walk follows helpers and methods to a
// start, and leaves out a test that starts nothing.
func TestPipelineStartsSeen(t *testing.T) {
	dir := t.TempDir()
	src := `package a

type fleet struct{}

func (f *fleet) pods() { testpod.Start(nil, nil) }
func start() *fleet { f := &fleet{}; f.pods(); return f }
func TestA(t *T) { start() }
func TestB(t *T) { other() }
func other() {}
`
	if err := writeFile(filepath.Join(dir, "a_test.go"), src); err != nil {
		t.Fatal(err)
	}
	got, n := testsReaching(t, relToTop(t, dir), pipelineStarts)
	if n != 2 || len(got) != 1 || got[0] != "TestA" {
		t.Errorf("got %v of %d tests, want [TestA] of 2", got, n)
	}
}

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o644) }
