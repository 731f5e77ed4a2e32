package deploy

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"

	"github.com/kvroute/kvroute/internal/inject"
)

// kustomizations lists every kustomization and component directory here.
func kustomizations(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(path))
		}
		return err
	})
	if err != nil || len(dirs) < 5 {
		t.Fatalf("%v: %v", err, dirs)
	}
	return dirs
}

// built builds dir and strictly decodes every object, keyed by Kind/name.
func built(t *testing.T, dir string) map[string]any {
	t.Helper()
	objs, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	for _, o := range objs {
		v, err := Decode(o)
		if err != nil {
			t.Fatalf("%s: %v\n%s", dir, err, o.YAML)
		}
		if _, dup := out[o.ID()]; dup {
			t.Fatalf("%s: %s twice", dir, o.ID())
		}
		out[o.ID()] = v
	}
	return out
}

// TestEveryKustomizationBuilds builds every kustomization (components
// through the examples that use them) and decodes every object strictly.
func TestEveryKustomizationBuilds(t *testing.T) {
	components := 0
	for _, dir := range kustomizations(t) {
		raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), "kind: Component") {
			components++
			continue // built by the examples that include it
		}
		t.Run(dir, func(t *testing.T) {
			objs := built(t, dir)
			if dir == "monitoring" { // the dashboard's ConfigMap, for components/monitoring
				if len(objs) != 1 {
					t.Fatalf("%d objects: %v", len(objs), objs)
				}
				return
			}
			if len(objs) < 6 {
				t.Fatalf("%d objects: %v", len(objs), objs)
			}
			checkSidecars(t, objs)
		})
	}
	if components != 4 {
		t.Fatalf("%d components", components)
	}
}

// TestBase checks the picker's manifests against the list.
func TestBase(t *testing.T) {
	objs := built(t, "base")
	d := objs["Deployment/kvroute-picker"].(*appsv1.Deployment)
	if *d.Spec.Replicas != 2 || d.Spec.Template.Spec.Affinity.PodAntiAffinity == nil {
		t.Fatalf("replicas %d, anti-affinity %v", *d.Spec.Replicas, d.Spec.Template.Spec.Affinity)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.Resources.Requests.Cpu().IsZero() {
		t.Fatalf("probes or resources: %+v", c)
	}
	// The probes use the admin port: the public one serves neither.
	if c.ReadinessProbe.HTTPGet.Port.String() != "admin" || c.LivenessProbe.HTTPGet.Port.String() != "admin" ||
		!slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "admin" && p.ContainerPort == 8081 }) {
		t.Fatalf("probes not on the admin port 8081: %+v %+v %+v", c.ReadinessProbe.HTTPGet, c.LivenessProbe.HTTPGet, c.Ports)
	}
	if !slices.Contains(c.Args, "--config=/etc/kvroute/picker/picker.json") || !hasSecretVolume(d, "kvroute-gossip-key") {
		t.Fatalf("config or gossip key: %v", c.Args)
	}
	svc := objs["Service/kvroute-picker"].(*corev1.Service)
	if ports(svc) != "http:8080,grpc:9000" {
		t.Fatalf("picker service ports %s", ports(svc))
	}
	if adm := objs["Service/kvroute-picker-admin"].(*corev1.Service); ports(adm) != "admin:8081" || adm.Spec.ClusterIP != "None" ||
		adm.Spec.Selector["app.kubernetes.io/name"] != "kvroute-picker" {
		t.Fatalf("picker admin service %s %+v", ports(adm), adm.Spec)
	}
	g := objs["Service/kvroute-gossip"].(*corev1.Service)
	if g.Spec.ClusterIP != "None" || !g.Spec.PublishNotReadyAddresses || g.Spec.Selector["kvroute.io/gossip"] != "true" {
		t.Fatalf("gossip service %+v", g.Spec)
	}
	if d.Spec.Template.Labels["kvroute.io/gossip"] != "true" {
		t.Fatal("the picker is not in the gossip pool")
	}
	if pdb := objs["PodDisruptionBudget/kvroute-picker"].(*policyv1.PodDisruptionBudget); pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Fatalf("pdb %+v", pdb.Spec)
	}
	// The base applies on any cluster: only built-in kinds, no CRD's.
	for id, v := range objs {
		switch v.(type) {
		case *appsv1.Deployment, *corev1.Service, *corev1.ConfigMap, *policyv1.PodDisruptionBudget, *networkingv1.NetworkPolicy:
		default:
			t.Errorf("%s is not a built-in kind: the base must apply on a cluster without CRDs", id)
		}
	}
	np := objs["NetworkPolicy/kvroute-picker"].(*networkingv1.NetworkPolicy)
	if len(np.Spec.Ingress) != 4 || np.Spec.Ingress[0].From != nil || np.Spec.Ingress[1].From[0].PodSelector.MatchLabels["kvroute.io/gossip"] != "true" {
		t.Fatalf("network policy %+v", np.Spec)
	}
	// The bookings streams: from the other pickers only.
	if peer := np.Spec.Ingress[2]; len(peer.From) != 1 || peer.From[0].PodSelector == nil ||
		peer.From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "kvroute-picker" || len(peer.Ports) != 1 || peer.Ports[0].Port.IntValue() != 9001 {
		t.Fatalf("the bookings streams' rule %+v", peer)
	}
	checkAdminPolicy(t, np, 8081)
	var cfg map[string]any
	if err := json.Unmarshal([]byte(generated(t, objs, "kvroute-picker").Data["picker.json"]), &cfg); err != nil || cfg["policy"] != "precise" ||
		cfg["admin-listen"] != ":8081" {
		t.Fatalf("picker.json: %v %v", err, cfg)
	}
}

// checkAdminPolicy: the NetworkPolicy opens the admin port only to the
// monitoring namespace and the pods labelled for admin access, and no
// rule open to everyone covers it.
func checkAdminPolicy(t *testing.T, np *networkingv1.NetworkPolicy, admin int) {
	t.Helper()
	rules := 0
	for _, in := range np.Spec.Ingress {
		for _, p := range in.Ports {
			end := p.Port.IntValue()
			if p.EndPort != nil {
				end = int(*p.EndPort)
			}
			if admin < p.Port.IntValue() || admin > end {
				continue
			}
			rules++
			if len(in.From) != 2 || in.From[0].NamespaceSelector == nil || in.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" ||
				in.From[1].PodSelector == nil || in.From[1].PodSelector.MatchLabels["kvroute.io/admin-access"] != "true" {
				t.Errorf("%s: the admin port %d is open to %+v", np.Name, admin, in.From)
			}
		}
	}
	if rules != 1 {
		t.Errorf("%s: %d rules cover the admin port %d, want 1", np.Name, rules, admin)
	}
}

// TestExampleFleet checks the vLLM Deployment the component patched: the
// sidecar, vLLM's flags and environment, the pool label, the Secret it
// needs, and the vLLM pods' NetworkPolicy.
func TestExampleFleet(t *testing.T) {
	objs := built(t, "examples/vllm")
	d := objs["Deployment/vllm-qwen3"].(*appsv1.Deployment)
	if d.Namespace != "llm" {
		t.Fatalf("namespace %q", d.Namespace)
	}
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 2 || spec.Containers[0].Name != "vllm" || spec.Containers[1].Name != "kvroute-sidecar" {
		t.Fatalf("containers %v", names(spec.Containers))
	}
	vllm, side := spec.Containers[0], spec.Containers[1]
	var events string
	for _, a := range vllm.Args {
		if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			events = v
		}
	}
	var kv map[string]any
	if err := json.Unmarshal([]byte(events), &kv); err != nil || kv["enable_kv_cache_events"] != true || kv["endpoint"] != "tcp://*:5557" || kv["replay_endpoint"] != "tcp://*:5657" {
		t.Fatalf("--kv-events-config %q: %v", events, err)
	}
	if !slices.Contains(vllm.Args, "--enable-prompt-tokens-details") || !slices.Contains(vllm.Args, "--model=Qwen/Qwen3-8B") {
		t.Fatalf("vllm args %v", vllm.Args)
	}
	if env(vllm, "PYTHONHASHSEED") != "0" {
		t.Fatal("PYTHONHASHSEED not fixed")
	}
	if side.Image != "kvroute:v0.1.0" || env(side, "POD_IP") != "" || side.Env[0].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Fatalf("sidecar image %q env %+v", side.Image, side.Env)
	}
	if env(vllm, "VLLM_ENABLE_SCALE_OUT_ENDPOINTS") != "1" {
		t.Fatal("the Responses render endpoint is not enabled")
	}
	for _, want := range []string{"--replay=tcp://127.0.0.1:5657", "--kv-events=tcp://127.0.0.1:5557", "--gossip-advertise=[$(POD_IP)]:7946", "--join=kvroute-gossip",
		"--engine-url=http://$(POD_IP):8000"} {
		if !slices.Contains(side.Args, want) {
			t.Errorf("sidecar args lack %s: %v", want, side.Args)
		}
	}
	// No readiness probe: the sidecar's /readyz fails while vLLM does not
	// answer, and vLLM's own probes decide whether it stays in its Service.
	if side.StartupProbe == nil || side.LivenessProbe == nil || side.ReadinessProbe != nil || side.Resources.Requests.Memory().IsZero() {
		t.Fatalf("sidecar probes or resources: %+v", side)
	}
	if d.Spec.Template.Labels["kvroute.io/gossip"] != "true" || d.Spec.Template.Labels["kvroute.io/role"] != "engine" {
		t.Fatalf("pod labels %v", d.Spec.Template.Labels)
	}
	if !hasSecretVolume(d, "kvroute-gossip-key") {
		t.Fatal("no gossip key volume")
	}
	if _, ok := objs["Secret/kvroute-gossip-key"]; ok {
		t.Fatal("the example must not carry a gossip key: it would replace the operator's")
	}
	np := objs["NetworkPolicy/kvroute-sidecars"].(*networkingv1.NetworkPolicy)
	if np.Spec.PodSelector.MatchLabels["kvroute.io/role"] != "engine" || *np.Spec.Ingress[0].Ports[0].EndPort != 8089 {
		t.Fatalf("sidecars network policy %+v", np.Spec)
	}
	checkAdminPolicy(t, np, 8090)
	// vLLM's P2P side channel is open to engine pods only.
	p2p := false
	for _, in := range np.Spec.Ingress {
		for _, p := range in.Ports {
			if p.Port != nil && p.Port.IntValue() == 5710 {
				p2p = len(in.From) == 1 && in.From[0].PodSelector != nil && in.From[0].PodSelector.MatchLabels["kvroute.io/role"] == "engine"
			}
		}
	}
	if !p2p {
		t.Fatal("the sidecars' network policy does not open the P2P side channel (5710) to engine pods only")
	}
	// The picker and the vLLM pods join the same pool.
	if objs["Service/kvroute-gossip"] == nil || objs["Deployment/kvroute-picker"] == nil || objs["Service/kvroute-sidecars"] == nil {
		t.Fatal("the example lacks the base or the component's objects")
	}
}

// TestDataParallelExample: two rank containers, both equipped, and the
// sidecar told of both (checkSidecars checks ports and counts).
func TestDataParallelExample(t *testing.T) {
	objs := built(t, "examples/vllm-dp2")
	d := objs["Deployment/vllm-qwen3-dp2"].(*appsv1.Deployment)
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 3 || !slices.Equal(names(cs), []string{"vllm", "kvroute-sidecar", "vllm-rank1"}) {
		t.Fatalf("containers %v", names(cs))
	}
	if !slices.Contains(cs[2].Args, "--data-parallel-rank=1") || env(cs[2], "PYTHONHASHSEED") != "0" {
		t.Fatalf("rank 1: %+v", cs[2])
	}
	if n := sidecarDP(t, objs, cs[1]); n != 2 {
		t.Fatalf("the sidecar follows %d ranks", n)
	}
}

// checkSidecars checks every Deployment with the sidecar: the sidecar
// reaches vLLM at the pod's address on rank 0's port; container r is rank
// r on that port + r, with kvroute's KV-event flags, the prompt-token
// details and the fixed hash seed; the sidecar follows as many ranks as
// there are vLLM containers.
func checkSidecars(t *testing.T, objs map[string]any) {
	t.Helper()
	for id, v := range objs {
		d, ok := v.(*appsv1.Deployment)
		if !ok {
			continue
		}
		side, engines := podContainers(d)
		if side == nil {
			continue
		}
		var base int
		for _, a := range side.Args {
			if u, ok := strings.CutPrefix(a, "--engine-url=http://$(POD_IP):"); ok {
				base, _ = strconv.Atoi(u)
			} else if strings.HasPrefix(a, "--engine-url=") {
				t.Errorf("%s: %s: pickers must reach the engine at the pod's address", id, a)
			}
		}
		if base == 0 || len(engines) == 0 {
			t.Fatalf("%s: engine port %d, %d vLLM containers", id, base, len(engines))
		}
		for r, c := range engines {
			port := vllmPort(c)
			events := slices.IndexFunc(c.Args, func(a string) bool {
				return strings.Contains(a, `"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5657"`)
			})
			if port != base+r || events < 0 || !slices.Contains(c.Args, "--enable-prompt-tokens-details") || env(c, "PYTHONHASHSEED") == "" {
				t.Errorf("%s: vLLM container %d (%s): port %d (want %d), args %v, env %v", id, r, c.Name, port, base+r, c.Args, c.Env)
			}
		}
		if n := sidecarDP(t, objs, *side); n != len(engines) {
			t.Errorf("%s: the sidecar follows %d ranks, the pod runs %d", id, n, len(engines))
		}
	}
}

// podContainers splits d's containers into the kvroute sidecar (nil if
// none) and the vLLM containers, in order (container r is rank r).
func podContainers(d *appsv1.Deployment) (side *corev1.Container, engines []corev1.Container) {
	for i, c := range d.Spec.Template.Spec.Containers {
		switch {
		case c.Name == "kvroute-sidecar":
			side = &d.Spec.Template.Spec.Containers[i]
		case strings.Contains(c.Image, "vllm"):
			engines = append(engines, c)
		}
	}
	return side, engines
}

// vllmPort is the HTTP port a vLLM container serves on: its --port, else
// vLLM's default 8000 (0 if --port does not parse).
func vllmPort(c corev1.Container) int {
	port := 8000
	for _, a := range c.Args {
		if p, ok := strings.CutPrefix(a, "--port="); ok {
			port, _ = strconv.Atoi(p)
		}
	}
	return port
}

// sidecarDP is the data-parallel size the sidecar runs with: its flag, else
// its settings file's, else 1.
func sidecarDP(t *testing.T, objs map[string]any, side corev1.Container) int {
	t.Helper()
	for _, a := range side.Args {
		if v, ok := strings.CutPrefix(a, "--data-parallel-size="); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	cm := findGenerated(objs, "kvroute-sidecar")
	if cm == nil {
		return 1
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(cm.Data["sidecar.json"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if n, ok := cfg["data-parallel-size"].(float64); ok {
		return int(n)
	}
	return 1
}

// TestAgenticAPIExample: agentic-api's LLM URL is the picker Service.
func TestAgenticAPIExample(t *testing.T) {
	objs := built(t, "examples/agentic-api")
	d := objs["Deployment/agentic-api"].(*appsv1.Deployment)
	svc := objs["Service/kvroute-picker"].(*corev1.Service)
	want := "http://" + svc.Name + ":8080/v1"
	if got := env(d.Spec.Template.Spec.Containers[0], "OPENAI_BASE_URL"); got != want {
		t.Fatalf("OPENAI_BASE_URL %q, want %q", got, want)
	}
}

// TestStrictDecoding: the decoder refuses what the API server would
// reject or misread.
func TestStrictDecoding(t *testing.T) {
	for name, tc := range map[string]struct{ apiVersion, kind, yaml string }{
		"unknown field":  {"apps/v1", "Deployment", "metadata: {name: x}\nspec: {replica: 2}\n"},
		"miscased field": {"apps/v1", "Deployment", "metadata: {name: x}\nspec: {Replicas: 2}\n"},
		"wrong type":     {"monitoring.coreos.com/v1", "ServiceMonitor", "metadata: {name: x}\nspec: {endpoints: [{port: 8080}]}\n"},
		"duplicate key":  {"v1", "Service", "metadata: {name: x}\nspec: {type: ClusterIP, type: NodePort}\n"},
		// v1alpha2's field names, refused by v1.
		"pool, old field":      {"inference.networking.k8s.io/v1", "InferencePool", "metadata: {name: x}\nspec: {targetPortNumber: 8000}\n"},
		"pool, wrong type":     {"inference.networking.k8s.io/v1", "InferencePool", "metadata: {name: x}\nspec: {targetPorts: [8000]}\n"},
		"pool, old selector":   {"inference.networking.k8s.io/v1", "InferencePool", "metadata: {name: x}\nspec: {selector: {app: vllm}}\n"},
		"route, unknown field": {"gateway.networking.k8s.io/v1", "HTTPRoute", "metadata: {name: x}\nspec: {rules: [{backendRef: []}]}\n"},
	} {
		y := "apiVersion: " + tc.apiVersion + "\nkind: " + tc.kind + "\n" + tc.yaml
		if _, err := Decode(Object{APIVersion: tc.apiVersion, Kind: tc.kind, Name: "x", YAML: []byte(y)}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ok := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: 2}\n"
	if _, err := Decode(Object{APIVersion: "apps/v1", Kind: "Deployment", Name: "x", YAML: []byte(ok)}); err != nil {
		t.Errorf("a valid Deployment: %v", err)
	}
	pool := "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec: {selector: {matchLabels: {app: vllm}}, targetPorts: [{number: 8000}], endpointPickerRef: {name: epp, port: {number: 9002}}}\n"
	if _, err := Decode(Object{APIVersion: "inference.networking.k8s.io/v1", Kind: "InferencePool", Name: "x", YAML: []byte(pool)}); err != nil {
		t.Errorf("a valid InferencePool: %v", err)
	}
	if _, err := Decode(Object{APIVersion: "inference.networking.x-k8s.io/v1alpha2", Kind: "InferencePool", Name: "x", YAML: []byte("kind: InferencePool\n")}); err == nil {
		t.Error("a v1alpha2 InferencePool was accepted")
	}
	if _, err := Decode(Object{APIVersion: "v1", Kind: "Pod", Name: "x", YAML: []byte("apiVersion: v1\nkind: Pod\n")}); err == nil {
		t.Error("an unexpected kind was accepted")
	}
}

// findGenerated returns the ConfigMap a configMapGenerator named name made
// (its name is name-HASH), or nil.
func findGenerated(objs map[string]any, name string) *corev1.ConfigMap {
	for id, v := range objs {
		if rest, ok := strings.CutPrefix(id, "ConfigMap/"+name+"-"); ok && len(rest) == 10 && !strings.Contains(rest, "-") {
			return v.(*corev1.ConfigMap)
		}
	}
	return nil
}

// generated is findGenerated, failing the test when there is none.
func generated(t *testing.T, objs map[string]any, name string) *corev1.ConfigMap {
	t.Helper()
	cm := findGenerated(objs, name)
	if cm == nil {
		t.Fatalf("no ConfigMap %s-HASH (a configMapGenerator's) among %v", name, keys(objs))
	}
	return cm
}

func keys(objs map[string]any) []string { return slices.Sorted(maps.Keys(objs)) }

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

func env(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func ports(s *corev1.Service) string {
	var out []string
	for _, p := range s.Spec.Ports {
		out = append(out, p.Name+":"+strconv.Itoa(int(p.Port)))
	}
	return strings.Join(out, ",")
}

func hasSecretVolume(d *appsv1.Deployment, name string) bool {
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == name {
			return true
		}
	}
	return false
}

// TestInjectMatchesComponent: `kvroute inject` and the kustomize component
// add the same sidecar — ports, environment, probes, resources and
// security context — differing only in how settings arrive (flags or the
// ConfigMap) and so in arguments and mounts.
func TestInjectMatchesComponent(t *testing.T) {
	objs := built(t, "examples/vllm")
	var fromComponent corev1.Container
	for _, c := range objs["Deployment/vllm-qwen3"].(*appsv1.Deployment).Spec.Template.Spec.Containers {
		if c.Name == "kvroute-sidecar" {
			fromComponent = c
		}
	}
	in, err := os.ReadFile(filepath.Join("..", "internal", "inject", "testdata", "basic.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := inject.Inject(in, inject.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := DecodeInto(out, &d); err != nil {
		t.Fatal(err)
	}
	fromInject := d.Spec.Template.Spec.Containers[len(d.Spec.Template.Spec.Containers)-1]
	for _, c := range []*corev1.Container{&fromComponent, &fromInject} {
		c.Image, c.Args, c.VolumeMounts = "", nil, nil
	}
	if !reflect.DeepEqual(fromComponent, fromInject) {
		t.Fatalf("the component's sidecar and inject's differ:\ncomponent %+v\ninject    %+v", fromComponent, fromInject)
	}
}
