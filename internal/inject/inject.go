package inject

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Names and ports shared with deploy/components/sidecar.
const (
	SidecarName     = "kvroute-sidecar"
	KVEventsPort    = 5557 // rank r publishes on KVEventsPort+r
	ReplayPort      = 5657 // rank r replays on ReplayPort+r: room for 100 ranks
	Topic           = "kv"
	gossipKeyVol    = "kvroute-gossip-key"
	defaultVLLMPort = 8000
)

// KVEventsConfig is the value of vLLM's --kv-events-config that inject
// adds.
var KVEventsConfig = fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:%d","replay_endpoint":"tcp://*:%d","topic":%q}`,
	KVEventsPort, ReplayPort, Topic)

// Options shape the injected sidecar. Zero values take the defaults in
// brackets.
type Options struct {
	// Image is the kvroute image [kvroute:latest].
	Image string
	// DataParallelSize is the number of vLLM data-parallel ranks in a pod
	// [vLLM's --data-parallel-size, else 1].
	DataParallelSize int
	// Capacity is the summaries' blocks per endpoint; it must equal the
	// pickers' --capacity [65536].
	Capacity int
	// GossipService is the headless Service to join [kvroute-gossip].
	GossipService string
	// GossipKeySecret holds the gossip keyring [kvroute-gossip-key].
	GossipKeySecret string
}

// Validate checks o.
func (o Options) Validate() error {
	var errs []error
	if o.DataParallelSize < 0 || o.DataParallelSize > 100 {
		errs = append(errs, fmt.Errorf("data-parallel size %d: want 1..100", o.DataParallelSize))
	}
	if o.Capacity < 0 {
		errs = append(errs, fmt.Errorf("capacity %d: want > 0", o.Capacity))
	}
	if strings.ContainsAny(o.Image, " \t\n") {
		errs = append(errs, fmt.Errorf("image %q: no spaces", o.Image))
	}
	return errors.Join(errs...)
}

func (o Options) withDefaults() Options {
	o.Image = cmp.Or(o.Image, "kvroute:latest")
	o.Capacity = cmp.Or(o.Capacity, 65536)
	o.GossipService = cmp.Or(o.GossipService, "kvroute-gossip")
	o.GossipKeySecret = cmp.Or(o.GossipKeySecret, "kvroute-gossip-key")
	return o
}

// Inject returns manifest with the sidecar added to every Deployment.
func Inject(manifest []byte, o Options) (_ []byte, err error) {
	// The YAML library assumes well-formed objects in places (a field's
	// value of an unexpected kind can panic it): malformed input is an
	// error, never a crash.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed manifest: %v", r)
		}
	}()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	nodes, err := kio.FromBytes(manifest)
	if err != nil {
		return nil, fmt.Errorf("reading the manifest: %w", err)
	}
	if len(nodes) == 0 {
		return nil, errors.New("the manifest holds no object")
	}
	for i, n := range nodes {
		if n.YNode().Kind != yaml.MappingNode {
			return nil, fmt.Errorf("document %d: not an object (a YAML mapping)", i+1)
		}
		if err := injectOne(n, o); err != nil {
			return nil, fmt.Errorf("%s: %w", objectID(n, i), err)
		}
	}
	out, err := kio.StringAll(nodes)
	if err != nil {
		return nil, err
	}
	return []byte(out), nil
}

// objectID names document i: Kind/name, or its position.
func objectID(n *yaml.RNode, i int) string {
	kind, name := n.GetKind(), n.GetName()
	switch {
	case kind != "" && name != "":
		return kind + "/" + name
	case kind != "":
		return fmt.Sprintf("%s (document %d, no name)", kind, i+1)
	}
	return fmt.Sprintf("document %d", i+1)
}

func injectOne(n *yaml.RNode, o Options) error {
	if n.GetApiVersion() != "apps/v1" || n.GetKind() != "Deployment" {
		return fmt.Errorf("not an apps/v1 Deployment (kvroute inject adds the sidecar to vLLM Deployments; apply other objects as they are)")
	}
	containers, err := n.Pipe(yaml.Lookup("spec", "template", "spec", "containers"))
	if err != nil || containers == nil || containers.YNode().Kind != yaml.SequenceNode {
		return fmt.Errorf("no spec.template.spec.containers list")
	}
	elems, err := containers.Elements()
	if err != nil {
		return err
	}
	ranks, err := vllmRanks(elems)
	if err != nil {
		return err
	}
	dp, port := len(ranks), ranks[0].port
	if o.DataParallelSize != 0 && o.DataParallelSize != dp {
		return fmt.Errorf("%d data-parallel rank(s) found (one vLLM container each), but %d was asked for", dp, o.DataParallelSize)
	}
	if err := checkPorts(port, dp); err != nil {
		return err
	}
	for _, r := range ranks {
		if v, ok := r.flags.value(kvEventsFlags...); ok && v != KVEventsConfig {
			return fmt.Errorf("container %s already has --kv-events-config %s; remove it so kvroute's (%s) can be added, or add the sidecar by hand", name(r.c), v, KVEventsConfig)
		}
		args, err := r.c.Pipe(yaml.LookupCreate(yaml.SequenceNode, "args"))
		if err != nil {
			return err
		}
		var add []string
		if _, ok := r.flags.value(kvEventsFlags...); !ok {
			add = append(add, "--kv-events-config="+KVEventsConfig)
		}
		if !r.flags.has("--enable-prompt-tokens-details", "--enable_prompt_tokens_details") {
			add = append(add, "--enable-prompt-tokens-details")
		}
		for _, a := range add {
			if err := args.PipeE(yaml.Append(yaml.NewStringRNode(a).YNode())); err != nil {
				return err
			}
		}
		for _, e := range [][2]string{{"PYTHONHASHSEED", "0"}, {"VLLM_ENABLE_SCALE_OUT_ENDPOINTS", "1"}} {
			if err := setEnv(r.c, e[0], e[1]); err != nil {
				return err
			}
		}
		if err := setPreStop(r.c); err != nil {
			return err
		}
	}
	// Room for the preStop, the sidecar's drain and the streams in flight
	// (the pod's own setting, when it has one, stays).
	spec, err := n.Pipe(yaml.Lookup("spec", "template", "spec"))
	if err != nil {
		return err
	}
	if spec.Field("terminationGracePeriodSeconds") == nil {
		grace := yaml.NewScalarRNode(fmt.Sprint(GraceSeconds))
		grace.YNode().Tag = yaml.NodeTagInt
		if err := spec.PipeE(yaml.SetField("terminationGracePeriodSeconds", grace)); err != nil {
			return err
		}
	}
	labels, err := n.Pipe(yaml.LookupCreate(yaml.MappingNode, "spec", "template", "metadata", "labels"))
	if err != nil {
		return err
	}
	for _, kv := range [][2]string{{"kvroute.io/gossip", "true"}, {"kvroute.io/role", "engine"}} {
		if err := labels.PipeE(yaml.SetField(kv[0], yaml.NewStringRNode(kv[1]))); err != nil {
			return err
		}
	}
	// The sidecar is written afresh each time (its flags follow the
	// vLLM containers), in place if it is there.
	sc, err := yaml.Parse(sidecarYAML(o, port, dp))
	if err != nil {
		return fmt.Errorf("the sidecar template: %w", err)
	}
	if i := slices.IndexFunc(elems, func(e *yaml.RNode) bool { return name(e) == SidecarName }); i >= 0 {
		containers.YNode().Content[i] = sc.YNode()
	} else if err := containers.PipeE(yaml.Append(sc.YNode())); err != nil {
		return err
	}
	volumes, err := n.Pipe(yaml.LookupCreate(yaml.SequenceNode, "spec", "template", "spec", "volumes"))
	if err != nil {
		return err
	}
	vols, err := volumes.Elements()
	if err != nil {
		return err
	}
	if findByName(vols, gossipKeyVol) == nil {
		v, err := yaml.Parse(fmt.Sprintf("name: %s\nsecret:\n  secretName: %s\n", gossipKeyVol, o.GossipKeySecret))
		if err != nil {
			return err
		}
		if err := volumes.PipeE(yaml.Append(v.YNode())); err != nil {
			return err
		}
	}
	return nil
}

// PreStopSeconds is the vLLM container's preStop sleep: on pod deletion
// the sidecar (which has none) gets SIGTERM at once and tells the pickers
// its engines are draining, while vLLM serves on for this long before its
// own SIGTERM. GraceSeconds is the pod's termination grace period when it
// sets none: the preStop, then the streams in flight.
const (
	PreStopSeconds = 10
	GraceSeconds   = 120
)

// setPreStop gives a vLLM container the preStop sleep, unless it has a
// preStop of its own.
func setPreStop(c *yaml.RNode) error {
	if ps, _ := c.Pipe(yaml.Lookup("lifecycle", "preStop")); ps != nil {
		return nil
	}
	lc, err := c.Pipe(yaml.LookupCreate(yaml.MappingNode, "lifecycle"))
	if err != nil {
		return err
	}
	hook, err := yaml.Parse(fmt.Sprintf("sleep:\n  seconds: %d\n", PreStopSeconds))
	if err != nil {
		return err
	}
	return lc.PipeE(yaml.SetField("preStop", hook))
}

// isVLLM reports whether a container runs vLLM: named vllm or vllm-…,
// running a vllm image, or running `vllm serve` or vLLM's API server.
func isVLLM(c *yaml.RNode) bool {
	if n := name(c); n == "vllm" || strings.HasPrefix(n, "vllm-") {
		return true
	}
	if img, _ := c.GetString("image"); strings.Contains(strings.ToLower(img), "vllm") {
		return true
	}
	words := strings.Join(append(stringList(c, "command"), stringList(c, "args")...), " ")
	return strings.Contains(words, "vllm serve") || strings.Contains(words, "vllm.entrypoints.openai.api_server")
}

// rank is a vLLM container and what its flags say.
type rank struct {
	c     *yaml.RNode
	flags flagList
	port  int
}

// Flag spellings vLLM accepts.
var (
	kvEventsFlags = []string{"--kv-events-config", "--kv_events_config"}
	dpSizeFlags   = []string{"--data-parallel-size", "--data_parallel_size", "-dp"}
	dpRankFlags   = []string{"--data-parallel-rank", "--data_parallel_rank", "-dpr"}
)

// vllmRanks finds the pod's vLLM containers: one, or one per
// data-parallel rank (rank r in container r, on port+r, as the sidecar
// follows them: vLLM's external load balancing). A container serving
// several ranks behind one API server cannot be routed to per rank.
func vllmRanks(cs []*yaml.RNode) ([]rank, error) {
	var ranks []rank
	for _, c := range cs {
		if name(c) == SidecarName || !isVLLM(c) {
			continue
		}
		r := rank{c: c, port: defaultVLLMPort}
		var err error
		if r.flags, err = flagsOf(c); err != nil {
			return nil, err
		}
		if v, ok := r.flags.value("--port"); ok {
			if r.port, err = strconv.Atoi(v); err != nil || r.port < 1 || r.port > 65535 {
				return nil, fmt.Errorf("container %s: --port %q", name(c), v)
			}
		}
		ranks = append(ranks, r)
	}
	if len(ranks) == 0 {
		return nil, fmt.Errorf("no vLLM container (want one named vllm, running a vllm image, or running `vllm serve`); containers: %s", containerNames(cs))
	}
	n := len(ranks)
	for i, r := range ranks {
		size, rk := 1, 0
		if v, ok := r.flags.value(dpSizeFlags...); ok {
			if size, _ = strconv.Atoi(v); size < 1 {
				return nil, fmt.Errorf("container %s: --data-parallel-size %q", name(r.c), v)
			}
		}
		v, hasRank := r.flags.value(dpRankFlags...)
		if hasRank {
			if rk, _ = strconv.Atoi(v); rk < 0 || strconv.Itoa(rk) != v {
				return nil, fmt.Errorf("container %s: --data-parallel-rank %q", name(r.c), v)
			}
		}
		switch {
		case size > 1 && !hasRank && n == 1:
			return nil, fmt.Errorf("container %s serves %d data-parallel ranks behind one API server; kvroute routes to each rank, so run one vllm serve per rank (container r: --data-parallel-rank r, --port %d+r)", name(r.c), size, r.port)
		case size != n || rk != i:
			return nil, fmt.Errorf("container %s: --data-parallel-size %d, rank %d; with %d vLLM container(s) kvroute expects size %d and rank %d (container order)", name(r.c), size, rk, n, n, i)
		case r.port != ranks[0].port+i:
			return nil, fmt.Errorf("container %s: rank %d on port %d, want %d (rank 0's port + rank)", name(r.c), i, r.port, ranks[0].port+i)
		}
	}
	return ranks, nil
}

// checkPorts refuses vLLM HTTP ports that collide with the sidecar's or the
// KV event ports.
func checkPorts(port, dp int) error {
	if port+dp-1 > 65535 {
		return fmt.Errorf("vLLM ports %d..%d out of range", port, port+dp-1)
	}
	for _, p := range []struct {
		at, n int
		what  string
	}{{7946, 1, "gossip"}, {8090, 1, "the sidecar's debug"}, {9090, 1, "the sidecar's gRPC"}, {KVEventsPort, dp, "KV events"}, {ReplayPort, dp, "replay"}} {
		if port < p.at+p.n && p.at < port+dp {
			return fmt.Errorf("vLLM's HTTP ports %d..%d overlap the %s port(s) %d..%d", port, port+dp-1, p.what, p.at, p.at+p.n-1)
		}
	}
	return nil
}

func findByName(elems []*yaml.RNode, want string) *yaml.RNode {
	for _, e := range elems {
		if name(e) == want {
			return e
		}
	}
	return nil
}

func name(n *yaml.RNode) string {
	s, _ := n.GetString("name")
	return s
}

func containerNames(cs []*yaml.RNode) string {
	var out []string
	for _, c := range cs {
		out = append(out, cmp.Or(name(c), "(unnamed)"))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// stringList returns a container's list field as strings (nil if absent).
func stringList(c *yaml.RNode, field string) []string {
	l, err := c.Pipe(yaml.Lookup(field))
	if err != nil || l == nil || l.YNode().Kind != yaml.SequenceNode {
		return nil
	}
	var out []string
	for _, e := range l.Content() {
		out = append(out, e.Value)
	}
	return out
}

// flagList is a container's command and args as vLLM sees them.
type flagList []string

func flagsOf(c *yaml.RNode) (flagList, error) {
	for _, field := range []string{"command", "args"} {
		if l, err := c.Pipe(yaml.Lookup(field)); err == nil && l != nil && l.YNode().Kind != yaml.SequenceNode {
			return nil, fmt.Errorf("container %s: %s is not a list", name(c), field)
		}
	}
	f := flagList(append(stringList(c, "command"), stringList(c, "args")...))
	if len(f) >= 2 && slices.Contains([]string{"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/env"}, f[0]) && slices.Contains(f[1:], "-c") {
		return nil, fmt.Errorf("container %s runs a shell script; inject cannot add flags to it: give vLLM's command and flags as lists, or add the sidecar by hand", name(c))
	}
	// A flag inject reads, last and without its value: the flags added
	// after it would become its value.
	if n := len(f); n > 0 && slices.Contains(slices.Concat([]string{"--port"}, kvEventsFlags, dpSizeFlags, dpRankFlags), f[n-1]) {
		return nil, fmt.Errorf("container %s: its flags end with %s, which needs a value (%s=N or %s N)", name(c), f[n-1], f[n-1], f[n-1])
	}
	return f, nil
}

// value returns the value of the flag under any of its spellings, given as
// --name=v or --name v (the last one wins, as in vLLM).
func (f flagList) value(spellings ...string) (v string, found bool) {
	for i, a := range f {
		for _, flag := range spellings {
			if val, ok := strings.CutPrefix(a, flag+"="); ok {
				v, found = val, true
			} else if a == flag && i+1 < len(f) {
				v, found = f[i+1], true
			}
		}
	}
	return v, found
}

func (f flagList) has(spellings ...string) bool {
	for _, a := range f {
		for _, flag := range spellings {
			if a == flag || strings.HasPrefix(a, flag+"=") {
				return true
			}
		}
	}
	return false
}

// setEnv adds name=value to the container's env unless name is set.
func setEnv(c *yaml.RNode, name, value string) error {
	env, err := c.Pipe(yaml.LookupCreate(yaml.SequenceNode, "env"))
	if err != nil {
		return err
	}
	elems, err := env.Elements()
	if err != nil {
		return err
	}
	if findByName(elems, name) != nil {
		return nil
	}
	e, err := yaml.Parse(fmt.Sprintf("name: %s\nvalue: %q\n", name, value))
	if err != nil {
		return err
	}
	return env.PipeE(yaml.Append(e.YNode()))
}

// sidecarYAML is the sidecar container (as in the kustomize component, with
// its settings as flags rather than a ConfigMap).
func sidecarYAML(o Options, vllmPort, dp int) string {
	return fmt.Sprintf(`name: %s
image: %s
args:
  - sidecar
  - --engine-url=http://$(POD_IP):%d
  - --kv-events=tcp://127.0.0.1:%d
  - --replay=tcp://127.0.0.1:%d
  - --topic=%s
  - --data-parallel-size=%d
  - --capacity=%d
  - --startup-timeout=30m
  - --grpc-listen=:9090
  - --debug-listen=:8090
  - --gossip-bind=0.0.0.0:7946
  - --gossip-advertise=[$(POD_IP)]:7946
  - --join=%s
  - --gossip-key-file=/etc/kvroute/gossip/keyring
  - --node-name=$(POD_NAME)
env:
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
ports:
  - name: kvr-grpc
    containerPort: 9090
    protocol: TCP
  - name: kvr-debug
    containerPort: 8090
    protocol: TCP
  - name: kvr-gossip-tcp
    containerPort: 7946
    protocol: TCP
  - name: kvr-gossip-udp
    containerPort: 7946
    protocol: UDP
startupProbe:
  httpGet:
    path: /healthz
    port: kvr-debug
  periodSeconds: 10
  failureThreshold: 180
livenessProbe:
  httpGet:
    path: /healthz
    port: kvr-debug
  periodSeconds: 10
  failureThreshold: 3
resources:
  requests:
    cpu: 250m
    memory: 256Mi
  limits:
    memory: 1Gi
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
volumeMounts:
  - name: %s
    mountPath: /etc/kvroute/gossip
    readOnly: true
`, SidecarName, o.Image, vllmPort, KVEventsPort, ReplayPort, Topic, dp, o.Capacity, o.GossipService, gossipKeyVol)
}
