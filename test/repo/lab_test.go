package repo

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// labMustRun are the production packages the lab must run rather than
// copy (DESIGN.md §14: nothing is re-implemented for it): the engine's
// scheduler and cache, the sidecar's index and summary, the picker's
// router, fleet state, decision, scoring, peers' policies, bookings and
// admission.
var labMustRun = []string{
	"picker", "picker/decide", "picker/predict", "picker/score", "picker/peers", "picker/inflight", "picker/admit", "picker/standing", "picker/fleet",
	"picker/localfleet", "sidecar/index", "internal/summary", "internal/blockkey", "test/enginesim/sched",
	"test/enginesim/kvcache", "test/enginesim/chat",
}

// TestLabRunsTheProductionCores: the lab depends on the production cores
// (not a copy of them), and no function of the lab has the body of a
// function of those packages — a decision written twice.
func TestLabRunsTheProductionCores(t *testing.T) {
	list := exec.Command("go", "list", "-deps", "./test/lab")
	list.Dir = top
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, p := range labMustRun {
		if !slices.Contains(deps, module+p) {
			t.Errorf("the lab does not run %s: it must call the production package, not a copy", p)
		}
	}
	bodies := map[string]string{} // a function's printed body → where
	for _, dir := range labMustRun {
		for body, where := range functionBodies(t, dir) {
			bodies[body] = where
		}
	}
	for _, dir := range packageDirs(t, "test/lab") {
		for body, where := range functionBodies(t, dir) {
			if orig, ok := bodies[body]; ok {
				t.Errorf("%s has the body of %s: call the production code instead of a copy", where, orig)
			}
		}
	}
}

// functionBodies maps the printed body of every function of five
// statements or more in dir's non-test sources to its name and file.
func functionBodies(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(top, dir, "*.go"))
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil || len(fd.Body.List) < 5 {
				continue
			}
			var b bytes.Buffer
			if err := printer.Fprint(&b, fset, fd.Body); err != nil {
				t.Fatal(err)
			}
			out[b.String()] = dir + "/" + filepath.Base(f) + ": " + fd.Name.Name
		}
	}
	return out
}
