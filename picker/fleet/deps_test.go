package fleet

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCoreStaysPure holds the package to the core's rules (DESIGN.md §3,
// doc.go): no I/O, sockets, RPC, protobuf, logging, metrics or locks among
// its imports, nothing of the kind among its dependencies, no goroutines,
// no clock reads and no package-level variables in its code.
func TestCoreStaysPure(t *testing.T) {
	direct := []string{"net", "os", "io", "sync", "log", "syscall", "unsafe", "runtime",
		"google.golang.org/grpc", "google.golang.org/protobuf", "go.uber.org/zap",
		"github.com/prometheus", "github.com/kvroute/kvroute/proto", "github.com/pebbe/zmq4"}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
		"AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		timeName := ""
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range direct {
				if path == bad || strings.HasPrefix(path, bad+"/") {
					t.Errorf("%s imports %s", name, path)
				}
			}
			if path == "time" {
				timeName = "time"
				if imp.Name != nil {
					timeName = imp.Name.Name
				}
			}
		}
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.VAR {
				t.Errorf("%s: package-level variable at %v", name, fset.Position(g.Pos()))
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: goroutine at %v", name, fset.Position(n.Pos()))
			case *ast.ChanType:
				t.Errorf("%s: channel at %v", name, fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && timeName != "" && x.Name == timeName && clock[n.Sel.Name] {
					t.Errorf("%s: reads the clock (time.%s) at %v", name, n.Sel.Name, fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
	if checked < 4 {
		t.Fatalf("checked %d files", checked)
	}

	// What it depends on, transitively: no sockets, RPC, logging or
	// metrics by way of another package either.
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 5 {
		t.Fatalf("go list found %d dependencies", len(deps))
	}
	for _, path := range deps {
		for _, bad := range []string{"net", "google.golang.org/grpc", "google.golang.org/protobuf", "go.uber.org/zap",
			"github.com/prometheus", "github.com/kvroute/kvroute/proto", "github.com/pebbe/zmq4"} {
			if path == bad || strings.HasPrefix(path, bad+"/") {
				t.Errorf("depends on %s", path)
			}
		}
	}
}
