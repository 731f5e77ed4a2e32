package sequence

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// violations lists what in files breaks the core's rules: an import
// beyond errors, fmt and time (so no net, os, logger, sync or syscall), a
// goroutine, or a time function that reads the clock or starts a timer
// (the core takes now as an argument instead).
func violations(fset *token.FileSet, files []*ast.File) []string {
	allowedImports := []string{"errors", "fmt", "time"}
	forbiddenTime := []string{"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "NewTimer", "NewTicker", "Tick"}
	var out []string
	for _, f := range files {
		timeName := ""
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !slices.Contains(allowedImports, path) {
				out = append(out, fset.Position(imp.Pos()).String()+": imports "+path)
			}
			if path == "time" {
				timeName = "time"
				if imp.Name != nil {
					timeName = imp.Name.Name
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				out = append(out, fset.Position(n.Pos()).String()+": starts a goroutine")
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && timeName != "" && id.Name == timeName && slices.Contains(forbiddenTime, n.Sel.Name) {
					out = append(out, fset.Position(n.Pos()).String()+": calls time."+n.Sel.Name)
				}
			}
			return true
		})
	}
	return out
}

// TestCoreDependencies: the package does no I/O, logging, goroutines or
// clock reads.
func TestCoreDependencies(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if len(files) < 2 {
		t.Fatalf("found %d source files", len(files))
	}
	for _, v := range violations(fset, files) {
		t.Error(v)
	}
}

// TestViolationsFound: the check catches what it is there for.
func TestViolationsFound(t *testing.T) {
	const bad = `package bad
import (
	"net"
	"os"
	"go.uber.org/zap"
	clock "time"
)
func f() {
	go func() {}()
	_ = clock.Now()
	clock.Sleep(1)
	<-clock.After(1)
	_, _, _ = net.Dial, os.Exit, zap.NewNop
}`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "bad.go", bad, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := violations(fset, []*ast.File{f})
	for _, want := range []string{"imports net", "imports os", "imports go.uber.org/zap", "starts a goroutine", "calls time.Now", "calls time.Sleep", "calls time.After"} {
		if !slices.ContainsFunc(got, func(v string) bool { return strings.HasSuffix(v, want) }) {
			t.Errorf("not reported: %s (got %v)", want, got)
		}
	}
}
