package inject

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/yaml"
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
		{deployment(`{name: vllm, args: [--port=8090]}`), Options{}, []string{"Deployment/x", "admin"}},
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

		// Multi-document manifests.
		{"no-vllm.yaml", Options{}, []string{"nothing to equip", "Deployment/web: no vLLM container (containers: web)"}},
		{"apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: extensions/v1beta1\nkind: Deployment\nmetadata: {name: old}\n---\nkind: [\n", Options{}, []string{"document 3 (line 9)", "yaml: line 9"}},
		{"apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: extensions/v1beta1\nkind: Deployment\nmetadata: {name: old}\n", Options{}, []string{"Service/a: not a workload", `Deployment/old: apiVersion "extensions/v1beta1": inject equips apps/v1 Deployments`}},
		{"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: vllm}]}\n---\nkind: ConfigMap\n", Options{}, []string{"Pod/p: not a workload inject equips", "ConfigMap (document 2, no name): not a workload"}},
		{"a: 1\n--- b: 2\n", Options{}, []string{"line 2", "a document separator must stand on its own line"}},
		{"---\n- 1\n", Options{}, []string{"document 1 (line 2): not an object"}},
		{"# only comments\n---\n---\n", Options{}, []string{"no object"}},
		{"apiVersion: v1\nkind: List\nitems: {a: 1}\n", Options{}, []string{"List (document 1, no name): items is not a list"}},
		{"apiVersion: v1\nkind: List\nitems: [1]\n", Options{}, []string{"item 1 of the List in document 1: not an object"}},
		{"apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: l}\nspec: {leaderWorkerTemplate: {leaderTemplate: {spec: {containers: []}}}}\n", Options{}, []string{"LeaderWorkerSet/l", "no spec.leaderWorkerTemplate.workerTemplate"}},
		{"apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: l}\nspec: {leaderWorkerTemplate: {workerTemplate: {spec: {containers: [{name: vllm, command: [ray, start, --address=x]}]}}}}\n", Options{}, []string{"nothing to equip", "LeaderWorkerSet/l: workerTemplate (the leader's too): no serving vLLM container: vllm runs a Ray worker"}},
		{"apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: l}\nspec: {leaderWorkerTemplate: {leaderTemplate: {spec: {containers: [{name: vllm, command: [sh, -c, \"vllm serve m | tee l\"]}]}}, workerTemplate: {spec: {containers: []}}}}\n", Options{}, []string{"LeaderWorkerSet/l: leaderTemplate: container vllm", "piped into `tee l`"}},
		{"apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: s}\nspec: {}\n", Options{}, []string{"StatefulSet/s", "no spec.template"}},
		{deployment(`{name: vllm, args: [m]}, 3`), Options{}, []string{"spec.template.spec.containers[1] is not a container"}},
		{deployment(`{name: vllm, args: [m, [--port]]}`), Options{}, []string{"container vllm: args[1] is not a string"}},

		// Aliases that cannot be expanded: a cycle, a billion laughs.
		{"apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n" + deployment(`{name: vllm, args: &a [*a]}`), Options{}, []string{"document 2 (line 5)", "line 8: the anchor &a is used inside itself"}},
		{laughs(), Options{}, []string{"document 1 (line 1)", "its aliases expand it to more than"}},

		// Shell scripts inject refuses, saying why.
		{shDeployment([]string{"sh", "-c"}, "vllm serve m | tee /log"), Options{}, []string{"Deployment/x: container vllm", "`vllm serve m` is piped into `tee /log`", "drop the pipe"}},
		{shDeployment([]string{"sh", "-c"}, "prepare | vllm serve m"), Options{}, []string{"reads a pipe from `prepare`"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m &"), Options{}, []string{"runs in the background (&)"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m & wait"), Options{}, []string{"is not the script's last command: `wait` is"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m > /log 2>&1"), Options{}, []string{"is redirected (`> /log`)", "drop the redirection"}},
		{shDeployment([]string{"sh", "-c"}, "! vllm serve m"), Options{}, []string{"is negated"}},
		{shDeployment([]string{"sh", "-c"}, "(cd /w && vllm serve m)"), Options{}, []string{"is in a subshell"}},
		{shDeployment([]string{"sh", "-c"}, "{ vllm serve m; }"), Options{}, []string{"is in a { … } group"}},
		{shDeployment([]string{"sh", "-c"}, "if true; then vllm serve m; fi"), Options{}, []string{"is inside an if"}},
		{shDeployment([]string{"sh", "-c"}, "while true; do vllm serve m; done"), Options{}, []string{"is inside a loop"}},
		{shDeployment([]string{"sh", "-c"}, "for i in 1; do vllm serve m; done"), Options{}, []string{"is inside a for loop"}},
		{shDeployment([]string{"sh", "-c"}, "case x in x) vllm serve m;; esac"), Options{}, []string{"is inside a case"}},
		{shDeployment([]string{"sh", "-c"}, "serve() { vllm serve m; }"), Options{}, []string{"is inside the function serve"}},
		{shDeployment([]string{"bash", "-c"}, "time vllm serve m"), Options{}, []string{"runs under time"}},
		{shDeployment([]string{"sh", "-c"}, "echo $(vllm serve m)"), Options{}, []string{"inside a command substitution"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m; echo done"), Options{}, []string{"is not the script's last command: `echo done` is, and flags added at the script's end would go to it"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m && touch /ready"), Options{}, []string{"`touch /ready` runs after it (&&)"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m || true"), Options{}, []string{"is followed by || `true`"}},
		{shDeployment([]string{"sh", "-c"}, "prepare || vllm serve m"), Options{}, []string{"runs only if `prepare` fails (||)"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve a --port 8000; vllm serve b --port 8001"), Options{}, []string{"runs vLLM 2 times (`vllm serve a --port 8000` and `vllm serve b --port 8001`)"}},
		{shDeployment([]string{"sh", "-c"}, "python3 /app/server.py"), Options{}, []string{"container vllm: it looks like vLLM (named vllm), but its sh script runs no vLLM server", "--vllm-container"}},
		{shDeployment([]string{"sh", "-c"}, "nohup vllm serve m"), Options{}, []string{"runs no vLLM server", "(it has `nohup vllm serve m`)"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m --port $PORT"), Options{}, []string{"--port $PORT: inject needs the value of --port", "only known when the pod starts"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m --port=$(VLLM_PORT)"), Options{}, []string{"--port=$(VLLM_PORT): inject needs the value of --port"}},
		{shDeployment([]string{"sh", "-c"}, `vllm serve m --data-parallel-size "$DP"`), Options{}, []string{`--data-parallel-size "$DP": inject needs the value`}},
		{shDeployment([]string{"sh", "-c"}, `vllm serve m --kv-events-config="$CFG"`), Options{}, []string{`--kv-events-config="$CFG": inject needs the value`}},
		{deployment(`{name: vllm, args: [--port, $(VLLM_PORT)]}`), Options{}, []string{"--port $(VLLM_PORT): inject needs the value of --port"}},
		{shDeployment([]string{"sh", "-c"}, `vllm serve "m`), Options{}, []string{"its sh script does not parse", "reached EOF"}},
		{shDeployment([]string{"sh", "-c"}, "function f { vllm serve m; }"), Options{}, []string{"its sh script does not parse", "bash feature"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m --port"), Options{}, []string{"its flags end with --port, which needs a value"}},
		{shDeployment([]string{"sh", "-c"}, `vllm serve m \`), Options{}, []string{"ends with a backslash"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m --kv-events-config='{}'"), Options{}, []string{"already has --kv-events-config {}"}},
		{shDeployment([]string{"sh", "-c"}, "vllm serve m -dp 2"), Options{}, []string{"2 data-parallel ranks behind one API server"}},
		{shDeployment([]string{"zsh", "-c"}, "vllm serve m"), Options{}, []string{"runs a zsh -c script; inject reads sh and bash scripts"}},
		{deployment(`{name: vllm, command: [/bin/sh, -c]}`), Options{}, []string{"runs sh -c with no script after it"}},

		// --vllm-container and --engine-port.
		{"basic.yaml", Options{VLLMContainers: []string{"engine"}}, []string{"nothing to equip", "Deployment/vllm-qwen3: no vLLM container (none named engine; containers: vllm)"}},
		{deployment(`{name: engine, command: [sh, -c, "python3 /serve.py"]}`), Options{VLLMContainers: []string{"engine"}}, []string{"container engine: it looks like vLLM (named with --vllm-container), but its sh script runs no vLLM server"}},
		{"basic.yaml", Options{EnginePort: 9000}, []string{"Deployment/vllm-qwen3: container vllm: its --port 8000 contradicts --engine-port 9000"}},
		{deployment(`{name: vllm, args: [-dp, "2", -dpr, "0"]}, {name: vllm-b, args: [-dp, "2", -dpr, "1", --port=9005]}`), Options{EnginePort: 9000}, []string{"container vllm-b: its --port 9005 contradicts --engine-port 9000 (rank 1: port 9001)"}},
		{deployment(`{name: vllm, args: [m]}`), Options{EnginePort: 8090}, []string{"overlap the sidecar's admin port"}},
		{"basic.yaml", Options{EnginePort: 70000}, []string{"engine port 70000"}},
		{"basic.yaml", Options{VLLMContainers: []string{"Bad_Name"}}, []string{`"Bad_Name": not a container name`}},
		{"basic.yaml", Options{VLLMContainers: []string{"kvroute-sidecar"}}, []string{"that is the sidecar's name"}},
		{"basic.yaml", Options{VLLMContainers: []string{"a", "a"}}, []string{`"a" given twice`}},
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

// laughs is a Deployment whose aliases expand it ten billion-fold.
func laughs() string {
	s := "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
	for i := 1; i < 10; i++ {
		s += fmt.Sprintf("a%d: &a%d [%s]\n", i, i, strings.Repeat(fmt.Sprintf("*a%d, ", i-1), 9)+fmt.Sprintf("*a%d", i-1))
	}
	return deployment(`{name: vllm, args: [m]}`) + s
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

// FuzzInject: no input panics; whatever is accepted injects to a fixed
// point; and the documents with no object equipped come out byte for
// byte, the text between documents too, in the same order.
func FuzzInject(f *testing.F) {
	var docs [][]byte
	for _, name := range []string{"basic.yaml", "command.yaml", "multi.yaml", "no-vllm.yaml", "multidoc.yaml",
		"statefulset.yaml", "lws.yaml", "vllm-docs-gpu.yaml", "lws-compound.yaml", "custom-name.yaml", "engine-port.yaml", "list.yaml", "service.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		docs = append(docs, b)
	}
	// Multi-document seeds: files joined, with the separators and trivia
	// people write.
	f.Add(bytes.Join([][]byte{docs[0], docs[12], docs[3]}, []byte("---\n")))
	f.Add(bytes.Join([][]byte{docs[12], docs[1]}, []byte("\n--- # next\n\n")))
	f.Add(append(append([]byte("%YAML 1.2\n---\n"), docs[7]...), "...\n"...))
	f.Add([]byte(shDeployment([]string{"bash", "-ec"}, "set -x\nexec vllm serve m --port 8001 # c\n") + "---\n" + deployment(`{name: vllm, command: [ray, start]}`)))
	// Aliases: a cycle (it overflowed the stack) and a billion laughs.
	f.Add([]byte(deployment(`{name: vllm, args: &a [*a]}`)))
	f.Add([]byte(laughs()))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 1<<16 {
			return
		}
		out, report, err := InjectReport(in, Options{})
		if err != nil {
			return
		}
		again, err := Inject(out, Options{})
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not a fixed point: %v\n%s\n---\n%s", err, out, again)
		}
		equipped := map[int]bool{}
		for _, ob := range report {
			equipped[ob.Doc] = equipped[ob.Doc] || ob.Equipped
		}
		segIn, errIn := split(in)
		segOut, errOut := split(out)
		if errIn != nil || errOut != nil || len(segIn) != len(segOut) {
			t.Fatalf("documents: %d in, %d out (%v, %v)\n%s", len(segIn), len(segOut), errIn, errOut, out)
		}
		for i, s := range segIn {
			if s.body != segOut[i].body || ((!s.body || !equipped[s.doc]) && !bytes.Equal(s.text, segOut[i].text)) {
				t.Fatalf("segment %d (document %d) changed:\n%q\n%q", i, s.doc, s.text, segOut[i].text)
			}
		}
		// And as a YAML parser reading the whole stream sees it: as many
		// documents, and no more changed than were equipped.
		vin, err := documents(in)
		if err != nil {
			return
		}
		vout, err := documents(out)
		if err != nil || len(vin) != len(vout) {
			t.Fatalf("%d documents in, %d out (%v):\n%s", len(vin), len(vout), err, out)
		}
		changed, n := 0, 0
		for i := range vin {
			if !reflect.DeepEqual(vin[i], vout[i]) {
				changed++
			}
		}
		for _, e := range equipped {
			if e {
				n++
			}
		}
		if changed > n {
			t.Fatalf("%d documents changed, %d equipped:\n%s", changed, n, out)
		}
	})
}

// documents decodes a YAML stream's non-empty documents.
func documents(b []byte) ([]any, error) {
	var out []any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var v any
		err := dec.Decode(&v)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if v != nil {
			out = append(out, v)
		}
	}
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
