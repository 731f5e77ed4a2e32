package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// instruction is one Dockerfile instruction, continuations joined.
type instruction struct {
	op, args string
}

// stage is a FROM and what follows it.
type stage struct {
	from, name string
	body       []instruction
}

// parseDockerfile returns the stages; stage 0 holds the instructions before
// the first FROM (global ARGs).
func parseDockerfile(t *testing.T, path string) []stage {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	stages := []stage{{name: "(global)"}}
	var line strings.Builder
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") && line.Len() == 0 {
			continue
		}
		if s, ok := strings.CutSuffix(strings.TrimRight(l, " "), "\\"); ok {
			line.WriteString(s + " ")
			continue
		}
		line.WriteString(l)
		text := strings.TrimSpace(line.String())
		line.Reset()
		if text == "" {
			continue
		}
		op, args, _ := strings.Cut(text, " ")
		in := instruction{strings.ToUpper(op), strings.Join(strings.Fields(args), " ")}
		if in.op == "FROM" {
			f := strings.Fields(in.args)
			st := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			continue
		}
		stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
	}
	return stages
}

func (s stage) all(op string) []string {
	var out []string
	for _, in := range s.body {
		if in.op == op {
			out = append(out, in.args)
		}
	}
	return out
}

// TestDockerfile checks the image's recipe (no Docker engine runs here):
// a build stage with cgo and libzmq's headers on the Go version go.mod
// names, a small runtime stage with only the shared library, a non-root
// user, the binary as entrypoint, and every port the manifests' kvroute
// containers use exposed.
func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, filepath.Join("..", "Dockerfile"))
	if len(stages) != 3 || stages[1].name != "build" {
		t.Fatalf("stages %+v", stages)
	}
	global, build, run := stages[0], stages[1], stages[2]
	gomod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if goVersion == nil || !strings.HasPrefix(build.from, "golang:${GO_VERSION}") ||
		!slices.Contains(global.all("ARG"), "GO_VERSION="+string(goVersion[1])) {
		t.Fatalf("build stage %s, ARG GO_VERSION must be go.mod's %s", build.from, goVersion)
	}
	buildRuns := strings.Join(build.all("RUN"), "\n")
	for _, want := range []string{"libzmq3-dev", "CGO_ENABLED=1", "go build", "./cmd/kvroute", "-X main.version="} {
		if !strings.Contains(buildRuns, want) {
			t.Errorf("build stage lacks %q", want)
		}
	}
	if !strings.Contains(run.from, "slim") {
		t.Errorf("runtime stage from %s: want a slim image", run.from)
	}
	runRuns := strings.Join(run.all("RUN"), "\n")
	if !strings.Contains(runRuns, "libzmq5") || strings.Contains(runRuns, "-dev") || strings.Contains(runRuns, "golang") {
		t.Errorf("runtime stage installs %q: want the shared library only", runRuns)
	}
	users := run.all("USER")
	if len(users) != 1 {
		t.Fatalf("runtime USER %v", users)
	}
	uid, err := strconv.Atoi(strings.Split(users[0], ":")[0])
	if err != nil || uid == 0 {
		t.Fatalf("runtime user %q: want a numeric non-root uid (runAsNonRoot needs a number)", users[0])
	}
	if !slices.Contains(run.all("COPY"), "--from=build /out/kvroute /usr/local/bin/kvroute") ||
		!slices.Contains(run.all("ENTRYPOINT"), `["/usr/local/bin/kvroute"]`) {
		t.Fatalf("runtime COPY %v ENTRYPOINT %v", run.all("COPY"), run.all("ENTRYPOINT"))
	}
	exposed := strings.Fields(strings.Join(run.all("EXPOSE"), " "))
	objs, err := Build("examples/vllm")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		v, err := Decode(o)
		if err != nil {
			t.Fatal(err)
		}
		d, ok := v.(*appsv1.Deployment)
		if !ok {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if !strings.HasPrefix(c.Image, "kvroute") {
				continue
			}
			if c.SecurityContext == nil || c.SecurityContext.RunAsUser == nil {
				if sc := d.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsUser == nil || int(*sc.RunAsUser) != uid {
					t.Errorf("%s %s: runAsUser must be the image's %d", o.ID(), c.Name, uid)
				}
			} else if int(*c.SecurityContext.RunAsUser) != uid {
				t.Errorf("%s %s: runAsUser %d, the image's user is %d", o.ID(), c.Name, *c.SecurityContext.RunAsUser, uid)
			}
			for _, p := range c.Ports {
				want := strconv.Itoa(int(p.ContainerPort))
				if p.Protocol == "UDP" {
					want += "/udp"
				}
				if !slices.Contains(exposed, want) {
					t.Errorf("%s %s: port %s not exposed by the image (EXPOSE %v)", o.ID(), c.Name, want, exposed)
				}
			}
		}
	}
}
