package inject

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestGolden injects each input and compares with its golden file, then
// injects the output again: nothing may change (idempotence).
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		in string
		o  Options
	}{
		{"basic.yaml", Options{Image: "kvroute:v0.1.0"}},
		{"command.yaml", Options{}},
		{"multi.yaml", Options{Capacity: 32768}},
		{"multidoc.yaml", Options{}},
		{"statefulset.yaml", Options{}},
		{"lws.yaml", Options{}},
		{"vllm-docs-gpu.yaml", Options{}},
		{"lws-compound.yaml", Options{}},
		{"custom-name.yaml", Options{VLLMContainers: []string{"engine"}}},
		{"engine-port.yaml", Options{EnginePort: 9000}},
		{"list.yaml", Options{}},
	} {
		t.Run(tc.in, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join("testdata", tc.in))
			if err != nil {
				t.Fatal(err)
			}
			out, err := Inject(in, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", strings.TrimSuffix(tc.in, ".yaml")+".golden.yaml")
			if *update {
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("output differs from %s (go test -run TestGolden -update to accept):\n%s", golden, out)
			}
			again, err := Inject(out, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, out) {
				t.Fatalf("injecting twice changed the manifest:\n%s", again)
			}
		})
	}
}

// TestWhatIsAdded checks the golden outputs' substance, so an accepted
// golden cannot lose it unnoticed.
func TestWhatIsAdded(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	basic := read("basic.golden.yaml")
	for _, want := range []string{
		"# An operator's vLLM Deployment: comments and order must survive.",
		"--model=Qwen/Qwen3-8B # the served model",
		"--kv-events-config=" + KVEventsConfig,
		"--enable-prompt-tokens-details",
		"name: PYTHONHASHSEED",
		"kvroute.io/gossip: \"true\"",
		"kvroute.io/role: engine",
		"name: kvroute-sidecar",
		"image: kvroute:v0.1.0",
		"--engine-url=http://$(POD_IP):8000",
		"--gossip-advertise=[$(POD_IP)]:7946",
		"name: VLLM_ENABLE_SCALE_OUT_ENDPOINTS",
		"--data-parallel-size=1",
		"secretName: kvroute-gossip-key",
		"name: models",                                            // the operator's volume stays
		"preStop:\n            sleep:\n              seconds: 10", // vLLM serves on while the sidecar drains
		"terminationGracePeriodSeconds: 120",
	} {
		if !strings.Contains(basic, want) {
			t.Errorf("basic.golden.yaml lacks %q", want)
		}
	}
	if strings.Count(basic, "name: kvroute-sidecar") != 1 {
		t.Error("more than one sidecar")
	}
	command := read("command.golden.yaml")
	for _, want := range []string{"--engine-url=http://$(POD_IP):8080", "image: kvroute:latest", "name: proxy"} {
		if !strings.Contains(command, want) {
			t.Errorf("command.golden.yaml lacks %q", want)
		}
	}
	// The engine container (not the proxy) received the flags: they follow
	// its command, in a new args list.
	if i, j := strings.Index(command, "name: engine"), strings.Index(command, "--enable-prompt-tokens-details"); i < 0 || j < i {
		t.Error("the flags did not go to the vLLM container")
	}
	multi := read("multi.golden.yaml")
	for _, want := range []string{"--data-parallel-size=2", "--capacity=32768", `value: "42"`, "vllm.entrypoints.openai.api_server", "---"} {
		if !strings.Contains(multi, want) {
			t.Errorf("multi.golden.yaml lacks %q", want)
		}
	}
	if strings.Count(multi, "name: kvroute-sidecar") != 2 || strings.Count(multi, "name: PYTHONHASHSEED") != 3 ||
		strings.Count(multi, "--enable-prompt-tokens-details") != 3 || strings.Count(multi, `value: "42"`) != 2 {
		t.Error("multi: want a sidecar in each Deployment, the flags and one PYTHONHASHSEED on each vLLM container (the operator's kept)")
	}
	if strings.Contains(basic, "readinessProbe:\n          httpGet:\n            path: /readyz") {
		t.Error("the sidecar must not gate the pod's readiness on /readyz")
	}
}

// TestErrors: objects inject cannot handle are named in a clear error.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		in   string // a testdata file, or the manifest itself
		o    Options
		want []string
	}{
		{"service.yaml", Options{}, []string{"nothing to equip", "Service/vllm: not a workload"}},
		{"no-vllm.yaml", Options{}, []string{"Deployment/web", "no vLLM container", "web"}},
		{"own-events.yaml", Options{}, []string{"Deployment/custom-events", "already has --kv-events-config"}},
		{"multi.yaml", Options{DataParallelSize: 4}, []string{"Deployment/dp-two", "2 data-parallel rank(s) found", "4 was asked for"}},
		{deployment(`{name: vllm, image: vllm/vllm-openai, args: [--data-parallel-size=4]}`), Options{}, []string{"Deployment/x", "4 data-parallel ranks behind one API server"}},
		{deployment(`{name: vllm, args: [--data-parallel-size=2, --data-parallel-rank=0]}, {name: vllm-b, args: [--data-parallel-size=2, --data-parallel-rank=0, --port=8001]}`), Options{}, []string{"container vllm-b", "rank 1"}},
		{deployment(`{name: vllm, args: [-dp, "2", --data-parallel-rank=0]}, {name: vllm-b, args: [-dp, "2", --data-parallel-rank=1, --port=8005]}`), Options{}, []string{"container vllm-b", "port 8005, want 8001"}},
		{deployment(`{name: vllm, args: [--port=8090]}`), Options{}, []string{"Deployment/x", "debug"}},
		{deployment(`{name: vllm, args: ['--kv_events_config={}']}`), Options{}, []string{"already has --kv-events-config"}},
		{"", Options{}, []string{"no object"}},
		{"kind: [", Options{}, []string{"document 1 (line 1)", "did not find expected node content"}},
		{"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: {}}}}\n", Options{}, []string{"Deployment/x", "containers list"}},
		{"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: vllm, args: --port}]}}}\n", Options{}, []string{"Deployment/x", "args is not a list"}},
		{"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: vllm, args: [--port=http]}]}}}\n", Options{}, []string{"--port"}},
		{"basic.yaml", Options{DataParallelSize: 101}, []string{"data-parallel size"}},
		// Found by FuzzInject: the flags added would have become its value.
		{deployment(`{name: vllm, args: ["000", --data-parallel-size]}`), Options{}, []string{"container vllm", "end with --data-parallel-size, which needs a value"}},
		{deployment(`{name: vllm, args: [--port]}`), Options{}, []string{"end with --port"}},
	} {
		in := []byte(tc.in)
		if strings.HasSuffix(tc.in, ".yaml") {
			var err error
			if in, err = os.ReadFile(filepath.Join("testdata", tc.in)); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Inject(in, tc.o)
		if err == nil {
			t.Errorf("%q: accepted", tc.in)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q lacks %q", tc.in, err, w)
			}
		}
	}
}

// deployment is a Deployment named x with the given containers (flow YAML).
func deployment(containers string) string {
	return "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [" + containers + "]}}}\n"
}

// TestSidecarFollowsEdits: injecting again after the vLLM container's port
// changed rewrites the sidecar to match.
func TestSidecarFollowsEdits(t *testing.T) {
	in, err := os.ReadFile(filepath.Join("testdata", "basic.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Inject(in, Options{})
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(out), "- --port=8000", "- --port=8100", 1)
	again, err := Inject([]byte(edited), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(again), "--engine-url=http://$(POD_IP):8100") || strings.Count(string(again), "name: kvroute-sidecar") != 1 {
		t.Fatalf("the sidecar did not follow the new port:\n%s", again)
	}
}

// FuzzInject: no input panics, and whatever is accepted injects to a
// fixed point.
func FuzzInject(f *testing.F) {
	for _, name := range []string{"basic.yaml", "command.yaml", "multi.yaml", "no-vllm.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 1<<16 {
			return
		}
		out, err := Inject(in, Options{})
		if err != nil {
			return
		}
		again, err := Inject(out, Options{})
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not a fixed point: %v\n%s\n---\n%s", err, out, again)
		}
	})
}

// TestOwnShutdownKept: a vLLM container's own preStop and the pod's own
// grace period stay as the operator set them.
func TestOwnShutdownKept(t *testing.T) {
	in, err := os.ReadFile(filepath.Join("testdata", "basic.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	own := strings.Replace(string(in), "      containers:\n", "      terminationGracePeriodSeconds: 600\n      containers:\n", 1)
	own = strings.Replace(own, "          env:\n            - name: HF_HOME", "          lifecycle:\n            preStop:\n              exec:\n                command: [\"/drain.sh\"]\n          env:\n            - name: HF_HOME", 1)
	out, err := Inject([]byte(own), Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if !strings.Contains(s, "/drain.sh") || strings.Contains(s, "seconds: 10") {
		t.Errorf("the operator's preStop was replaced:\n%s", s)
	}
	if !strings.Contains(s, "terminationGracePeriodSeconds: 600") || strings.Count(s, "terminationGracePeriodSeconds") != 1 {
		t.Errorf("the operator's grace period was changed:\n%s", s)
	}
}
