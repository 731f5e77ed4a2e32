package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/deploy"
)

// TestManifestFlags checks every kvroute container and settings file in
// the deploy examples against the real commands: each flag in the
// containers' args is listed by `kvroute <sub> --help` and parses, and each
// key of the ConfigMaps' JSON settings is a flag whose value is accepted —
// so renaming a flag cannot silently break the manifests.
func TestManifestFlags(t *testing.T) {
	commands := map[string]func() *cobra.Command{
		"picker":  func() *cobra.Command { c, _, _ := pickerCommand(); return c },
		"sidecar": func() *cobra.Command { c, _, _ := sidecarCommand(); return c },
	}
	settings := map[string]string{"picker.json": "picker", "sidecar.json": "sidecar"}
	seen := map[string]int{}
	for _, dir := range []string{"examples/vllm", "examples/vllm-dp2", "examples/agentic-api", "examples/gateway", "examples/gateway-dp2", "examples/mtls"} {
		objs, err := deploy.Build(filepath.Join("..", "..", "deploy", dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			v, err := deploy.Decode(o)
			if err != nil {
				t.Fatal(err)
			}
			switch v := v.(type) {
			case *appsv1.Deployment:
				for _, c := range v.Spec.Template.Spec.Containers {
					if c.Image != "kvroute" && !strings.HasPrefix(c.Image, "kvroute:") {
						continue
					}
					if len(c.Args) == 0 || commands[c.Args[0]] == nil {
						t.Fatalf("%s: container %s runs %v: not a kvroute subcommand", o.ID(), c.Name, c.Args)
					}
					checkArgs(t, o.ID()+" "+c.Name, commands[c.Args[0]], c.Args)
					seen[c.Args[0]]++
				}
			case *corev1.ConfigMap:
				for file, sub := range settings {
					if js, ok := v.Data[file]; ok {
						path := filepath.Join(t.TempDir(), file)
						if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
							t.Fatal(err)
						}
						if err := applyConfigFile(commands[sub]().Flags(), path); err != nil {
							t.Errorf("%s %s: %v", o.ID(), file, err)
						}
						seen[file]++
					}
				}
			}
		}
	}
	if seen["picker"] != 6 || seen["sidecar"] != 6 || seen["picker.json"] != 6 || seen["sidecar.json"] != 6 {
		t.Fatalf("checked %v", seen)
	}
}

// checkArgs parses args (a subcommand and its flags) with a fresh command
// and checks every flag is in the subcommand's help.
func checkArgs(t *testing.T, where string, mk func() *cobra.Command, args []string) {
	t.Helper()
	code, help, _ := runArgs(args[0], "--help")
	if code != 0 {
		t.Fatalf("%s --help: exit %d", args[0], code)
	}
	for _, a := range args[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !strings.Contains(help, "--"+name+" ") {
			t.Errorf("%s: %s is not in `kvroute %s --help`", where, a, args[0])
		}
	}
	if err := mk().ParseFlags(args[1:]); err != nil {
		t.Errorf("%s: %v", where, err)
	}
}

// TestInjectCommand runs `kvroute inject` on files and stdin: the output is
// the library's, idempotent through the command, its sidecar's flags are
// the real command's, and bad manifests exit 1 naming the object.
func TestInjectCommand(t *testing.T) {
	in := filepath.Join("..", "..", "internal", "inject", "testdata", "basic.yaml")
	code, out, errOut := runArgs("inject", "-f", in, "--image", "kvroute:test")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var d appsv1.Deployment
	if err := deploy.DecodeInto([]byte(out), &d); err != nil {
		t.Fatalf("the output does not decode strictly: %v\n%s", err, out)
	}
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 2 || cs[1].Name != "kvroute-sidecar" || cs[1].Image != "kvroute:test" {
		t.Fatalf("containers %+v", cs)
	}
	checkArgs(t, "injected sidecar", func() *cobra.Command { c, _, _ := sidecarCommand(); return c }, cs[1].Args)

	// Again, through stdin: nothing changes.
	root := newRootCommand(nil, nil)
	var again, stderr strings.Builder
	root.SetOut(&again)
	root.SetErr(&stderr)
	root.SetIn(strings.NewReader(out))
	root.SetArgs([]string{"inject", "-f", "-", "--image", "kvroute:test"})
	if err := root.Execute(); err != nil || again.String() != out {
		t.Fatalf("second injection: %v %s\n%s", err, stderr.String(), again.String())
	}

	svc := filepath.Join("..", "..", "internal", "inject", "testdata", "service.yaml")
	if code, _, errOut := runArgs("inject", "-f", svc); code != 1 || !strings.Contains(errOut, "Service/vllm") {
		t.Fatalf("a Service: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runArgs("inject"); code != 2 || !strings.Contains(errOut, "-f FILE") {
		t.Fatalf("no file: exit %d, %q", code, errOut)
	}
}

// TestInjectReportAndFlags: `kvroute inject` writes only the manifest to
// stdout and one line per object to stderr, and --vllm-container (repeated
// or comma-separated) and --engine-port reach inject's Options.
func TestInjectReportAndFlags(t *testing.T) {
	testdata := func(name string) string { return filepath.Join("..", "..", "internal", "inject", "testdata", name) }
	golden := func(name string) string {
		b, err := os.ReadFile(testdata(name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		args   []string
		golden string
		report []string
	}{
		{[]string{"-f", testdata("multidoc.yaml")}, "multidoc.golden.yaml", []string{
			"passed through ConfigMap/chat-settings: not a workload",
			"equipped Deployment/qwen3: 1 rank (container vllm), port 8000",
			"passed through Service/qwen3: not a workload",
			"passed through Deployment/web: no vLLM container (containers: web)",
			"passed through ServiceMonitor/qwen3: not a workload",
		}},
		{[]string{"-f", testdata("custom-name.yaml"), "--vllm-container", "engine"}, "custom-name.golden.yaml", []string{"equipped Deployment/assistant: 1 rank (container engine), port 8000"}},
		{[]string{"-f", testdata("custom-name.yaml"), "--vllm-container", "other,engine"}, "custom-name.golden.yaml", []string{"equipped Deployment/assistant: 1 rank (container engine), port 8000"}},
		{[]string{"-f", testdata("custom-name.yaml"), "--vllm-container", "other", "--vllm-container", "engine"}, "custom-name.golden.yaml", []string{"equipped Deployment/assistant: 1 rank (container engine), port 8000"}},
		{[]string{"-f", testdata("engine-port.yaml"), "--engine-port", "9000"}, "engine-port.golden.yaml", []string{"equipped Deployment/qwen3-9000: 1 rank (container vllm), port 9000"}},
	} {
		code, out, errOut := runArgs(append([]string{"inject", "--image", "kvroute:latest"}, tc.args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errOut)
		}
		if out != golden(tc.golden) {
			t.Errorf("%v: stdout is not %s:\n%s", tc.args, tc.golden, out)
		}
		if want := strings.Join(tc.report, "\n") + "\n"; errOut != want {
			t.Errorf("%v: stderr\n%s\nwant\n%s", tc.args, errOut, want)
		}
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-f", testdata("basic.yaml"), "--engine-port", "9001"}, 1, "container vllm: its --port 8000 contradicts --engine-port 9001"},
		{[]string{"-f", testdata("basic.yaml"), "--vllm-container", "engine"}, 1, "no vLLM container (none named engine; containers: vllm)"},
		{[]string{"-f", testdata("basic.yaml"), "--engine-port", "70000"}, 2, "engine port 70000"},
		{[]string{"-f", testdata("basic.yaml"), "--vllm-container", "Bad_Name"}, 2, `"Bad_Name": not a container name`},
		{[]string{"-f", testdata("no-vllm.yaml")}, 1, "nothing to equip"},
	} {
		code, out, errOut := runArgs(append([]string{"inject"}, tc.args...)...)
		if code != tc.code || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
	}
}

// TestShutdownTimings checks, in every deploy example, that a pod's
// shutdown fits its grace period: the picker's preStop, drain delay and
// shutdown timeout (its settings as the manifests give them), and on an
// engine pod, vLLM's preStop outlasting the sidecar's drain delay, so the
// pickers hear "draining" while vLLM still serves.
func TestShutdownTimings(t *testing.T) {
	for _, dir := range []string{"examples/vllm", "examples/vllm-dp2", "examples/agentic-api", "examples/gateway", "examples/gateway-dp2", "examples/mtls"} {
		objs, err := deploy.Build(filepath.Join("..", "..", "deploy", dir))
		if err != nil {
			t.Fatal(err)
		}
		files := map[string]string{}
		var deps []*appsv1.Deployment
		for _, o := range objs {
			v, err := deploy.Decode(o)
			if err != nil {
				t.Fatal(err)
			}
			switch v := v.(type) {
			case *appsv1.Deployment:
				deps = append(deps, v)
			case *corev1.ConfigMap:
				for k, js := range v.Data {
					files[k] = js
				}
			}
		}
		settings := func(name string, f *pflag.FlagSet) {
			js, ok := files[name]
			if !ok {
				t.Fatalf("%s: no %s", dir, name)
			}
			path := filepath.Join(t.TempDir(), name)
			if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := applyConfigFile(f, path); err != nil {
				t.Fatal(err)
			}
		}
		pc, pcfg, _ := pickerCommand()
		settings("picker.json", pc.Flags())
		sc, scfg, _ := sidecarCommand()
		settings("sidecar.json", sc.Flags())
		preStop := func(c corev1.Container) time.Duration {
			if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
				return 0
			}
			return time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
		}
		checked := 0
		for _, d := range deps {
			spec := d.Spec.Template.Spec
			var pickers, sidecars, engines []corev1.Container
			for _, c := range spec.Containers {
				switch {
				case len(c.Args) > 0 && c.Args[0] == "picker":
					pickers = append(pickers, c)
				case len(c.Args) > 0 && c.Args[0] == "sidecar":
					sidecars = append(sidecars, c)
				case strings.HasPrefix(c.Name, "vllm"):
					engines = append(engines, c)
				}
			}
			if len(pickers)+len(sidecars) == 0 {
				continue // not kvroute's
			}
			if spec.TerminationGracePeriodSeconds == nil {
				t.Errorf("%s %s: no terminationGracePeriodSeconds (the default 30 s cuts long streams)", dir, d.Name)
				continue
			}
			grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
			for _, c := range pickers {
				need := preStop(c) + pcfg.DrainDelay + pcfg.ShutdownTimeout
				if preStop(c) == 0 || need > grace {
					t.Errorf("%s %s: preStop %v + drain-delay %v + shutdown-timeout %v = %v, grace %v", dir, d.Name, preStop(c), pcfg.DrainDelay, pcfg.ShutdownTimeout, need, grace)
				}
				checked++
			}
			for _, c := range sidecars {
				if preStop(c) != 0 || scfg.DrainDelay <= 0 {
					t.Errorf("%s %s: the sidecar must get SIGTERM at once (no preStop) and announce draining (drain-delay %v)", dir, d.Name, scfg.DrainDelay)
				}
				if len(engines) == 0 {
					t.Errorf("%s %s: a sidecar without a vLLM container", dir, d.Name)
				}
				for _, e := range engines {
					if preStop(e) <= scfg.DrainDelay || preStop(e) >= grace {
						t.Errorf("%s %s: %s must serve on (preStop %v) past the sidecar's drain delay %v, within the grace %v", dir, d.Name, e.Name, preStop(e), scfg.DrainDelay, grace)
					}
				}
				checked++
			}
		}
		if checked < 2 {
			t.Errorf("%s: checked %d Deployments, want a picker and an engine", dir, checked)
		}
	}
}
