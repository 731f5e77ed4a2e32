package repo

import (
	"go/ast"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// maxFuncLines bounds a function's length in the components and the
// engine (issue 33): past it, a function does several things that want
// names of their own.
const maxFuncLines = 100

// sized are the trees held to maxFuncLines (test files aside).
var sized = []string{"picker", "sidecar", "test/enginesim"}

// longFuncs lists the functions of the package in dir (non-test sources)
// longer than maxFuncLines, with their lengths.
func longFuncs(t *testing.T, dir string) []string {
	t.Helper()
	fset, files := parsedSources(t, dir)
	var out []string
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
				out = append(out, fset.Position(fd.Pos()).Filename+": "+fd.Name.Name+" runs "+strconv.Itoa(n)+" lines")
			}
		}
	}
	return out
}

// TestNoLongFunctions: no function in picker/, sidecar/ or test/enginesim
// (test files aside) runs over maxFuncLines lines.
func TestNoLongFunctions(t *testing.T) {
	for _, root := range sized {
		for _, dir := range packageDirs(t, root) {
			for _, p := range longFuncs(t, dir) {
				t.Errorf("%s (at most %d: split it into named steps)", p, maxFuncLines)
			}
		}
	}
}

// TestLongFunctionsCaught: the rule sees a planted long function, and not
// a long test.
func TestLongFunctionsCaught(t *testing.T) {
	dir := t.TempDir()
	body := "package a\n\nfunc long() {\n" + strings.Repeat("\t_ = 1\n", maxFuncLines) + "}\n\nfunc short() {}\n"
	if err := os.WriteFile(filepath.Join(dir, "a.go"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a_test.go"), []byte(strings.Replace(body, "long()", "longTest()", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	got := longFuncs(t, relToTop(t, dir))
	if len(got) != 1 || !strings.Contains(got[0], "long runs 102 lines") {
		t.Errorf("planted: %q", got)
	}
}
