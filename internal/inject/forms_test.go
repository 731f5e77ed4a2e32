package inject

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/kvroute/kvroute/deploy"
)

// leaderWorkerSet substitutes for sigs.k8s.io/lws's LeaderWorkerSet (that
// module is not a dependency here): the fields the vLLM docs' example and
// the test inputs use, decoded strictly, so that a misplaced or misspelt
// field in inject's output fails the test.
type leaderWorkerSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Replicas             *int32 `json:"replicas,omitempty"`
		LeaderWorkerTemplate struct {
			Size           *int32                  `json:"size,omitempty"`
			RestartPolicy  string                  `json:"restartPolicy,omitempty"`
			LeaderTemplate *corev1.PodTemplateSpec `json:"leaderTemplate,omitempty"`
			WorkerTemplate corev1.PodTemplateSpec  `json:"workerTemplate"`
		} `json:"leaderWorkerTemplate"`
	} `json:"spec"`
}

// decoded is a manifest's objects, strictly decoded into their Kubernetes
// types, in order.
type decoded []any

// decodeAll strictly decodes every document of a manifest (and each item
// of a List); kinds without a type here are kept as their kind's name.
func decodeAll(t *testing.T, manifest []byte) decoded {
	t.Helper()
	var out decoded
	var decodeOne func(n *yaml.Node)
	decodeOne = func(n *yaml.Node) {
		b, err := yaml.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		kind := yaml.NewRNode(n).GetKind()
		var v any
		switch kind {
		case "Deployment":
			v = &appsv1.Deployment{}
		case "StatefulSet":
			v = &appsv1.StatefulSet{}
		case "LeaderWorkerSet":
			v = &leaderWorkerSet{}
		case "Service":
			v = &corev1.Service{}
		case "ConfigMap":
			v = &corev1.ConfigMap{}
		case "List":
			for _, item := range yaml.NewRNode(n).Field("items").Value.Content() {
				decodeOne(item)
			}
			return
		default:
			out = append(out, kind)
			return
		}
		if err := deploy.DecodeInto(b, v); err != nil {
			t.Fatalf("%s does not decode strictly: %v\n%s", kind, err, b)
		}
		out = append(out, v)
	}
	dec := yaml.NewDecoder(bytes.NewReader(manifest))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if n := yaml.NewRNode(&doc); !yaml.IsMissingOrNull(n) {
			decodeOne(n.YNode())
		}
	}
}

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// flagsAdded is what inject appends to a vLLM command in a script.
var flagsAdded = " --kv-events-config='" + KVEventsConfig + "' --enable-prompt-tokens-details"

func containerNamed(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// equippedPod checks a pod template inject equipped: the given containers
// then the sidecar, following vLLM on port, the labels, the key volume, a
// PYTHONHASHSEED on each vLLM container.
func equippedPod(t *testing.T, where string, p corev1.PodTemplateSpec, port int, vllm ...string) {
	t.Helper()
	cs := p.Spec.Containers
	if last := cs[len(cs)-1]; last.Name != SidecarName || !slices.Contains(last.Args, "--engine-url=http://$(POD_IP):"+strconv.Itoa(port)) {
		t.Errorf("%s: the last container is not the sidecar following port %d: %v", where, port, names(cs))
	}
	if p.Labels["kvroute.io/gossip"] != "true" || p.Labels["kvroute.io/role"] != "engine" {
		t.Errorf("%s: labels %v", where, p.Labels)
	}
	if !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "kvroute-gossip-key" }) {
		t.Errorf("%s: no gossip key volume", where)
	}
	for _, n := range vllm {
		c := containerNamed(cs, n)
		if c == nil || !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "PYTHONHASHSEED" }) || c.Lifecycle == nil {
			t.Errorf("%s: container %s lacks PYTHONHASHSEED or its preStop", where, n)
		}
	}
}

// untouchedPod checks a pod template inject left alone.
func untouchedPod(t *testing.T, where string, got, in corev1.PodTemplateSpec) {
	t.Helper()
	if containerNamed(got.Spec.Containers, SidecarName) != nil || got.Labels["kvroute.io/gossip"] != "" {
		t.Errorf("%s: equipped, want it as it was", where)
	}
	if g, w := got.String(), in.String(); g != w {
		t.Errorf("%s changed:\n%s\nwant\n%s", where, g, w)
	}
}

// TestWhatIsAddedToEachForm decodes each new golden output strictly into
// Kubernetes types and checks its substance against its input, so that an
// accepted golden cannot lose it unnoticed.
func TestWhatIsAddedToEachForm(t *testing.T) {
	golden := func(name string) (in, out decoded) {
		return decodeAll(t, read(t, name+".yaml")), decodeAll(t, read(t, name+".golden.yaml"))
	}

	t.Run("multidoc", func(t *testing.T) {
		in, out := golden("multidoc")
		if len(out) != 5 {
			t.Fatalf("%d objects, want 5", len(out))
		}
		equippedPod(t, "qwen3", out[1].(*appsv1.Deployment).Spec.Template, 8000, "vllm")
		if got := out[1].(*appsv1.Deployment).Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, []string{"--model=Qwen/Qwen3-8B", "--kv-events-config=" + KVEventsConfig, "--enable-prompt-tokens-details"}) {
			t.Errorf("qwen3's args %q", got)
		}
		untouchedPod(t, "web", out[3].(*appsv1.Deployment).Spec.Template, in[3].(*appsv1.Deployment).Spec.Template)
		if out[0].(*corev1.ConfigMap).Data["greeting"] != "hello" || out[4] != "ServiceMonitor" {
			t.Errorf("objects %v", out)
		}
	})

	t.Run("statefulset", func(t *testing.T) {
		_, out := golden("statefulset")
		s := out[0].(*appsv1.StatefulSet)
		equippedPod(t, "llama", s.Spec.Template, 8100, "vllm")
		if len(s.Spec.VolumeClaimTemplates) != 1 || s.Spec.ServiceName != "llama" {
			t.Errorf("the StatefulSet's own fields changed: %+v", s.Spec)
		}
	})

	t.Run("lws", func(t *testing.T) {
		in, out := golden("lws")
		lin, lout := in[0].(*leaderWorkerSet), out[0].(*leaderWorkerSet)
		leader := lout.Spec.LeaderWorkerTemplate.LeaderTemplate
		equippedPod(t, "leaderTemplate", *leader, 8080, "vllm-leader")
		if leader.Labels["role"] != "leader" || len(leader.Spec.Volumes) != 2 {
			t.Errorf("the leader's own labels or volumes lost: %v %v", leader.Labels, leader.Spec.Volumes)
		}
		script := lin.Spec.LeaderWorkerTemplate.LeaderTemplate.Spec.Containers[0].Command[2]
		if got := leader.Spec.Containers[0].Command; !slices.Equal(got, []string{"sh", "-c", script + flagsAdded}) {
			t.Errorf("the leader's command %q, want the flags at the end of its script", got)
		}
		untouchedPod(t, "workerTemplate", lout.Spec.LeaderWorkerTemplate.WorkerTemplate, lin.Spec.LeaderWorkerTemplate.WorkerTemplate)
		if *lout.Spec.Replicas != 2 || *lout.Spec.LeaderWorkerTemplate.Size != 2 || lout.Spec.LeaderWorkerTemplate.RestartPolicy != "RecreateGroupOnPodRestart" {
			t.Errorf("the LeaderWorkerSet's own fields changed: %+v", lout.Spec)
		}
		if svc := out[1].(*corev1.Service); svc.Spec.Selector["role"] != "leader" {
			t.Errorf("the Service: %+v", svc.Spec)
		}
	})

	t.Run("vllm-docs-gpu", func(t *testing.T) {
		in, out := golden("vllm-docs-gpu")
		d := out[0].(*appsv1.Deployment)
		equippedPod(t, "mistral-7b", d.Spec.Template, 8000, "mistral-7b")
		c, cin := d.Spec.Template.Spec.Containers[0], in[0].(*appsv1.Deployment).Spec.Template.Spec.Containers[0]
		if !slices.Equal(c.Command, []string{"/bin/sh", "-c"}) || !slices.Equal(c.Args, []string{cin.Args[0] + flagsAdded}) {
			t.Errorf("command %q args %q", c.Command, c.Args)
		}
		if c.LivenessProbe.HTTPGet.Path != "/health" || len(d.Spec.Template.Spec.Volumes) != 3 {
			t.Error("the operator's probes or volumes lost")
		}
	})

	t.Run("lws-compound", func(t *testing.T) {
		in, out := golden("lws-compound")
		lin, lout := in[0].(*leaderWorkerSet), out[0].(*leaderWorkerSet)
		equippedPod(t, "leaderTemplate", *lout.Spec.LeaderWorkerTemplate.LeaderTemplate, 8080, "vllm-leader")
		script := lin.Spec.LeaderWorkerTemplate.LeaderTemplate.Spec.Containers[0].Args[0]
		want := strings.Replace(script, "--pipeline-parallel-size 4", "--pipeline-parallel-size 4"+flagsAdded, 1)
		if got := lout.Spec.LeaderWorkerTemplate.LeaderTemplate.Spec.Containers[0].Args; !slices.Equal(got, []string{want}) {
			t.Errorf("the leader's script:\n%s\nwant\n%s", got, want)
		}
		untouchedPod(t, "workerTemplate", lout.Spec.LeaderWorkerTemplate.WorkerTemplate, lin.Spec.LeaderWorkerTemplate.WorkerTemplate)
	})

	t.Run("custom-name", func(t *testing.T) {
		in, out := golden("custom-name")
		p, pin := out[0].(*appsv1.Deployment).Spec.Template, in[0].(*appsv1.Deployment).Spec.Template
		equippedPod(t, "assistant", p, 8000, "engine")
		if got := containerNamed(p.Spec.Containers, "engine").Args; !slices.Equal(got, append(slices.Clone(pin.Spec.Containers[1].Args), "--kv-events-config="+KVEventsConfig, "--enable-prompt-tokens-details")) {
			t.Errorf("engine's args %q", got)
		}
		if got, want := p.Spec.Containers[0].String(), pin.Spec.Containers[0].String(); got != want {
			t.Errorf("the container not named with --vllm-container changed:\n%s", got)
		}
	})

	t.Run("engine-port", func(t *testing.T) {
		in, out := golden("engine-port")
		p := out[0].(*appsv1.Deployment).Spec.Template
		equippedPod(t, "qwen3-9000", p, 9000, "vllm")
		if got := p.Spec.Containers[0].Args; len(got) != len(in[0].(*appsv1.Deployment).Spec.Template.Spec.Containers[0].Args)+2 || slices.ContainsFunc(got, func(a string) bool { return strings.HasPrefix(a, "--port") }) {
			t.Errorf("args %q: want only the two flags added, no --port", got)
		}
	})

	t.Run("list", func(t *testing.T) {
		in, out := golden("list")
		equippedPod(t, "List item 1", out[0].(*appsv1.Deployment).Spec.Template, 8000, "vllm")
		if got, want := out[1].(*corev1.Service).String(), in[1].(*corev1.Service).String(); got != want {
			t.Errorf("List item 2 changed:\n%s", got)
		}
		if !bytes.Contains(read(t, "list.golden.yaml"), []byte("kind: List\n")) {
			t.Error("the output is no longer a List")
		}
	})
}

// TestPassThroughBytes: the documents inject does not equip come out byte
// for byte, comments, spacing and order kept: the output is the input with
// only the equipped document's text replaced.
func TestPassThroughBytes(t *testing.T) {
	for _, tc := range []struct {
		file, equipped string // the equipped document's first line
		o              Options
	}{
		{"multidoc.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: qwen3\n", Options{}},
		{"lws.yaml", "apiVersion: leaderworkerset.x-k8s.io/v1\n", Options{}},
		{"vllm-docs-gpu.yaml", "apiVersion: apps/v1\n", Options{}},
	} {
		in := string(read(t, tc.file))
		out, report, err := InjectReport([]byte(in), tc.o)
		if err != nil {
			t.Fatal(err)
		}
		start := strings.Index(in, tc.equipped)
		end := strings.Index(in[start:], "\n---") + start + 1
		before, after := in[:start], in[end:]
		if !strings.HasPrefix(string(out), before) || !strings.HasSuffix(string(out), after) || len(out) < len(in) {
			t.Errorf("%s: the documents around the equipped one changed:\n%s", tc.file, out)
		}
		equipped := 0
		for _, ob := range report {
			if ob.Equipped {
				equipped++
			}
		}
		if equipped != 1 {
			t.Errorf("%s: report %v", tc.file, report)
		}
	}
}

// TestReport: one line per object, in order, saying what was done.
func TestReport(t *testing.T) {
	for _, tc := range []struct {
		file string
		o    Options
		want []string
	}{
		{"multidoc.yaml", Options{}, []string{
			"passed through ConfigMap/chat-settings: not a workload",
			"equipped Deployment/qwen3: 1 rank (container vllm), port 8000",
			"passed through Service/qwen3: not a workload",
			"passed through Deployment/web: no vLLM container (containers: web)",
			"passed through ServiceMonitor/qwen3: not a workload",
		}},
		{"lws.yaml", Options{}, []string{
			"equipped LeaderWorkerSet/vllm: leaderTemplate: 1 rank (container vllm-leader), port 8080; workerTemplate: unchanged, no serving vLLM container: vllm-worker runs a Ray worker (no API server)",
			"passed through Service/vllm-leader: not a workload",
		}},
		{"multi.yaml", Options{}, []string{
			"equipped Deployment/dp-two: 2 ranks (containers vllm, vllm-rank1), ports 8000-8001",
			"equipped Deployment/serve-module: 1 rank (container main), port 8000",
		}},
		{"list.yaml", Options{}, []string{
			"equipped Deployment/qwen3 (item 1 of the List in document 1): 1 rank (container vllm), port 8000",
			"passed through Service/qwen3 (item 2 of the List in document 1): not a workload",
		}},
		{"custom-name.yaml", Options{VLLMContainers: []string{"engine"}}, []string{"equipped Deployment/assistant: 1 rank (container engine), port 8000"}},
		{"engine-port.yaml", Options{EnginePort: 9000}, []string{"equipped Deployment/qwen3-9000: 1 rank (container vllm), port 9000"}},
	} {
		_, report, err := InjectReport(read(t, tc.file), tc.o)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ob := range report {
			got = append(got, ob.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: report\n%s\nwant\n%s", tc.file, strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
		}
	}
}

// shDeployment is a Deployment whose container vllm runs script with the
// given shell command.
func shDeployment(shell []string, script string) string {
	var words []string
	for _, w := range append(slices.Clone(shell), script) {
		words = append(words, strconv.Quote(w))
	}
	return deployment(`{name: vllm, image: vllm/vllm-openai, command: [` + strings.Join(words, ", ") + `]}`)
}

// TestScripts: the shell scripts inject accepts get the flags at the end of
// their vLLM command, the rest byte for byte, and inject twice changes
// nothing; "⟨flags⟩" marks where the flags go.
func TestScripts(t *testing.T) {
	sh := []string{"/bin/sh", "-c"}
	for _, tc := range []struct {
		shell        []string
		script, want string
		port         int
		o            Options
	}{
		{sh, "vllm serve m", "vllm serve m⟨flags⟩", 8000, Options{}},
		{sh, "exec vllm serve m --port 8001", "exec vllm serve m --port 8001⟨flags⟩", 8001, Options{}},
		{sh, "HF_HOME=/models exec /usr/local/bin/vllm serve m --port=8002;", "HF_HOME=/models exec /usr/local/bin/vllm serve m --port=8002⟨flags⟩;", 8002, Options{}},
		{sh, "set -e; pip install x && python3.12 -m vllm.entrypoints.openai.api_server --model m", "set -e; pip install x && python3.12 -m vllm.entrypoints.openai.api_server --model m⟨flags⟩", 8000, Options{}},
		{sh, "vllm serve m # the model\n", "vllm serve m⟨flags⟩ # the model\n", 8000, Options{}},
		{sh, "env A=1 B=2 python3 -u -m vllm.entrypoints.openai.api_server \\\n  --port \"8003\"\n", "env A=1 B=2 python3 -u -m vllm.entrypoints.openai.api_server \\\n  --port \"8003\"⟨flags⟩\n", 8003, Options{}},
		{sh, `vllm serve "$(MODEL)" --served-model-name "$NAME" --port '8004'`, `vllm serve "$(MODEL)" --served-model-name "$NAME" --port '8004'⟨flags⟩`, 8004, Options{}},
		{sh, "vllm serve m --port 9000", "vllm serve m --port 9000⟨flags⟩", 9000, Options{EnginePort: 9000}},
		{[]string{"bash", "-lc"}, "[[ -d /models ]] && vllm serve /models/m", "[[ -d /models ]] && vllm serve /models/m⟨flags⟩", 8000, Options{}},
		{[]string{"/usr/bin/env", "bash", "-o", "pipefail", "-ec"}, "vllm serve m", "vllm serve m⟨flags⟩", 8000, Options{}},
		{[]string{"sh", "-e", "-c"}, "vllm serve m", "vllm serve m⟨flags⟩", 8000, Options{}},
		// The flags there already (from an earlier injection, say) are read.
		{sh, "vllm serve m --enable-prompt-tokens-details", "vllm serve m --enable-prompt-tokens-details --kv-events-config='" + KVEventsConfig + "'", 8000, Options{}},
	} {
		in := shDeployment(tc.shell, tc.script)
		out, err := Inject([]byte(in), tc.o)
		if err != nil {
			t.Errorf("%q: %v", tc.script, err)
			continue
		}
		var d appsv1.Deployment
		if err := deploy.DecodeInto(out, &d); err != nil {
			t.Fatal(err)
		}
		want := strings.Replace(tc.want, "⟨flags⟩", flagsAdded, 1)
		if got := d.Spec.Template.Spec.Containers[0].Command; !slices.Equal(got, append(slices.Clone(tc.shell), want)) {
			t.Errorf("%q: command %q, want the script %q", tc.script, got, want)
		}
		equippedPod(t, tc.script, d.Spec.Template, tc.port, "vllm")
		if again, err := Inject(out, tc.o); err != nil || !bytes.Equal(again, out) {
			t.Errorf("%q: injecting twice changed it: %v\n%s", tc.script, err, again)
		}
	}
}

// TestNotServing: containers that run vLLM but serve no API are left as
// they are; a pod with no other vLLM server is not equipped.
func TestNotServing(t *testing.T) {
	web := "---\n" + deployment(`{name: vllm, args: [--model=m]}`)
	for _, tc := range []struct{ container, want string }{
		{`{name: vllm, image: vllm/vllm-openai, command: [sh, -c, "vllm serve m --headless --node-rank 1"]}`, "vllm runs vllm serve --headless (no API server)"},
		{`{name: vllm, image: vllm/vllm-openai, args: [m, --headless]}`, "vllm runs vllm serve --headless"},
		{`{name: vllm, command: [ray, start, --address=$(LWS_LEADER_ADDRESS), --block]}`, "vllm runs a Ray worker"},
		{`{name: vllm, command: [bash, -c, "set -e; ray start --address=$(LWS_LEADER_ADDRESS) --block"]}`, "vllm runs a Ray worker"},
	} {
		in := strings.Replace(deployment(tc.container), "name: x", "name: worker", 1) + web
		_, report, err := InjectReport([]byte(in), Options{})
		if err != nil {
			t.Errorf("%s: %v", tc.container, err)
			continue
		}
		if got := report[0].String(); report[0].Equipped || !strings.Contains(got, "no serving vLLM container: "+tc.want) {
			t.Errorf("%s: %s", tc.container, got)
		}
	}
}

// TestLeaderWorkerSets: the templates of a LeaderWorkerSet, each equipped
// when it runs a vLLM server.
func TestLeaderWorkerSets(t *testing.T) {
	lws := func(templates string) string {
		return "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: l}\nspec:\n  leaderWorkerTemplate:\n    size: 2\n" + templates
	}
	serving := "spec: {containers: [{name: vllm, command: [vllm, serve, m]}]}"
	ray := "spec: {containers: [{name: vllm, command: [ray, start, --address=x]}]}"
	for _, tc := range []struct {
		in, want string
	}{
		// No leaderTemplate: LWS runs the leader from the worker template.
		{lws("    workerTemplate: {" + serving + "}\n"), "equipped LeaderWorkerSet/l: workerTemplate (the leader's too): 1 rank (container vllm), port 8000"},
		{lws("    leaderTemplate: {" + serving + "}\n    workerTemplate: {" + serving + "}\n"), "equipped LeaderWorkerSet/l: leaderTemplate: 1 rank (container vllm), port 8000; workerTemplate: 1 rank (container vllm), port 8000"},
		{lws("    leaderTemplate: {" + ray + "}\n    workerTemplate: {" + serving + "}\n"), "equipped LeaderWorkerSet/l: leaderTemplate: unchanged, no serving vLLM container: vllm runs a Ray worker (no API server); workerTemplate: 1 rank (container vllm), port 8000"},
	} {
		out, report, err := InjectReport([]byte(tc.in), Options{})
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if report[0].String() != tc.want {
			t.Errorf("report %q, want %q", report[0], tc.want)
		}
		var l leaderWorkerSet
		if err := deploy.DecodeInto(out, &l); err != nil {
			t.Fatal(err)
		}
		sidecars := strings.Count(string(out), "name: "+SidecarName)
		if want := strings.Count(tc.want, "1 rank"); sidecars != want {
			t.Errorf("%d sidecars, want %d:\n%s", sidecars, want, out)
		}
	}
}
