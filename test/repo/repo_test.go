package repo

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const top = "../.."

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(top, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestQuickStart: the README's Quick start has exactly two commands,
// `make demo` then `make test`.
func TestQuickStart(t *testing.T) {
	readme := read(t, "README.md")
	i := strings.Index(readme, "## Quick start")
	if i < 0 {
		t.Fatal("README.md has no Quick start section")
	}
	section := readme[i+len("## Quick start"):]
	if j := strings.Index(section, "\n## "); j >= 0 {
		section = section[:j]
	}
	blocks := regexp.MustCompile("(?s)```[a-z]*\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) != 1 {
		t.Fatalf("Quick start has %d code blocks, want 1", len(blocks))
	}
	var cmds []string
	for _, line := range strings.Split(blocks[0][1], "\n") {
		if line = strings.TrimSpace(strings.SplitN(line, "#", 2)[0]); line != "" {
			cmds = append(cmds, line)
		}
	}
	if strings.Join(cmds, ";") != "make demo;make test" {
		t.Fatalf("Quick start commands %q, want [make demo, make test]", cmds)
	}
}

// TestCIRunsMakeTest: .ci/run runs `make test` and nothing else.
func TestCIRunsMakeTest(t *testing.T) {
	var cmds []string
	for _, line := range strings.Split(read(t, ".ci/run"), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "set ") || strings.HasPrefix(line, "cd ") {
			continue
		}
		cmds = append(cmds, line)
	}
	if len(cmds) != 1 || cmds[0] != "make test" {
		t.Fatalf(".ci/run runs %q, want only make test", cmds)
	}
	mk := read(t, "Makefile")
	if !regexp.MustCompile(`(?m)^test: deps$`).MatchString(mk) || !strings.Contains(mk, "-race") {
		t.Fatal("make test does not run deps first and the tests with -race")
	}
}

// TestEveryPackageHasDoc: each Go package states its contract in doc.go.
func TestEveryPackageHasDoc(t *testing.T) {
	dirs := map[string]bool{}
	err := filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != top || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 5 {
		t.Fatalf("found only %d packages", len(dirs))
	}
	for dir := range dirs {
		if dir == filepath.Join(top, "cmd", "kvroute") {
			continue // a command documents itself in main.go
		}
		if _, err := os.Stat(filepath.Join(dir, "doc.go")); err != nil {
			t.Errorf("%s has no doc.go", dir)
		}
	}
}

// TestDepsReportsMissing: when make deps cannot install (not root), it
// prints one clear line naming what is missing and fails.
func TestDepsReportsMissing(t *testing.T) {
	bin := t.TempDir()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bash, filepath.Join(bin, "bash")); err != nil {
		t.Fatal(err)
	}
	// A PATH with bash and an `id` that says we are not root, and nothing
	// else: no pkg-config, protoc or gcc.
	if err := os.WriteFile(filepath.Join(bin, "id"), []byte("#!"+bash+"\necho 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bash, filepath.Join(top, "scripts", "deps.sh"))
	cmd.Env = []string{"PATH=" + bin}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("deps.sh without tools or root: %v (stdout %q)", err, stdout.String())
	}
	msg := strings.TrimSpace(stderr.String())
	if strings.Count(msg, "\n") != 0 {
		t.Fatalf("want one line, got %q", msg)
	}
	for _, want := range []string{"missing", "pkg-config", "libzmq3-dev", "protobuf-compiler"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not name %s", msg, want)
		}
	}
}

// TestGeneratedProtoIsCurrent regenerates proto/ into a temporary folder
// with the pinned plugins and compares with the committed code.
func TestGeneratedProtoIsCurrent(t *testing.T) {
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Fatalf("protoc not installed (make deps installs it): %v", err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "google.golang.org/protobuf/cmd/protoc-gen-go", "google.golang.org/grpc/cmd/protoc-gen-go-grpc")
	build.Dir = top
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the protoc plugins: %v\n%s", err, out)
	}
	files, err := filepath.Glob(filepath.Join(top, "proto", "kvroute", "v1", "*.proto"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no .proto files: %v", err)
	}
	out := t.TempDir()
	args := []string{"-I", filepath.Join(top, "proto"), "--go_out=" + out, "--go_opt=paths=source_relative",
		"--go-grpc_out=" + out, "--go-grpc_opt=paths=source_relative"}
	gen := exec.Command(protoc, append(args, files...)...)
	gen.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if o, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, o)
	}
	generated, _ := filepath.Glob(filepath.Join(out, "kvroute", "v1", "*.go"))
	if len(generated) == 0 {
		t.Fatal("protoc generated nothing")
	}
	for _, g := range generated {
		want, _ := os.ReadFile(g)
		have, err := os.ReadFile(filepath.Join(top, "proto", "kvroute", "v1", filepath.Base(g)))
		if err != nil || !bytes.Equal(want, have) {
			t.Errorf("proto/kvroute/v1/%s is stale or missing: run make proto and commit", filepath.Base(g))
		}
	}
}
