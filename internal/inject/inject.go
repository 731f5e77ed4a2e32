package inject

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

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
	// VLLMContainers names the vLLM containers (--vllm-container): when
	// set, exactly the containers so named are vLLM's, in the order they
	// appear in the pod (rank order), and no container is recognised by its
	// name, image or command [containers named vllm or vllm-…, with a vllm
	// image, or running vllm serve or vLLM's API server].
	VLLMContainers []string
	// EnginePort is the port vLLM serves on (rank r on EnginePort+r) when
	// its flags give no --port (--engine-port); a --port contradicting it
	// is an error [8000, and any --port goes].
	EnginePort int
}

// dnsLabel is a Kubernetes container name.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

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
	if o.EnginePort < 0 || o.EnginePort > 65535 {
		errs = append(errs, fmt.Errorf("engine port %d: want 1..65535", o.EnginePort))
	}
	for i, n := range o.VLLMContainers {
		switch {
		case !dnsLabel.MatchString(n):
			errs = append(errs, fmt.Errorf("vLLM container name %q: not a container name (lower-case letters, digits and -, at most 63)", n))
		case n == SidecarName:
			errs = append(errs, fmt.Errorf("vLLM container name %q: that is the sidecar's name", n))
		case slices.Contains(o.VLLMContainers[:i], n):
			errs = append(errs, fmt.Errorf("vLLM container name %q given twice", n))
		}
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

// Object is what Inject did with one object of the manifest.
type Object struct {
	// ID names the object: Kind/name, or its position.
	ID string
	// Doc is the document it is in, from 1 (the items of a List share
	// theirs).
	Doc int
	// Equipped: the sidecar was added. Otherwise the object passed
	// through unchanged.
	Equipped bool
	// Detail says what was equipped ("1 rank (container vllm), port
	// 8000"), or why the object passed through ("not a workload").
	Detail string
}

// String is the object's line in `kvroute inject`'s report.
func (o Object) String() string {
	if o.Equipped {
		return "equipped " + o.ID + ": " + o.Detail
	}
	return "passed through " + o.ID + ": " + o.Detail
}

// Inject returns manifest with the sidecar added to every vLLM workload
// and every other object as it was.
func Inject(manifest []byte, o Options) ([]byte, error) {
	out, _, err := InjectReport(manifest, o)
	return out, err
}

// InjectReport is Inject, also saying what it did with each object, in
// the manifest's order.
func InjectReport(manifest []byte, o Options) ([]byte, []Object, error) {
	if err := o.Validate(); err != nil {
		return nil, nil, err
	}
	o = o.withDefaults()
	segs, err := split(manifest)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the manifest: %w", err)
	}
	var out bytes.Buffer
	var objs []Object
	equipped := 0
	for _, s := range segs {
		if !s.body {
			out.Write(s.text)
			continue
		}
		text, these, err := injectDocument(s, o)
		if err != nil {
			return nil, nil, err
		}
		out.Write(text)
		objs = append(objs, these...)
		for _, ob := range these {
			if ob.Equipped {
				equipped++
			}
		}
	}
	if len(objs) == 0 {
		return nil, nil, errors.New("the manifest holds no object")
	}
	if equipped == 0 {
		var seen []string
		for _, ob := range objs {
			seen = append(seen, "\n  "+ob.ID+": "+ob.Detail)
		}
		return nil, nil, fmt.Errorf("nothing to equip: inject adds the sidecar to Deployments, StatefulSets and LeaderWorkerSets whose pods run a vLLM server (a container named vllm or vllm-…, with a vllm image, or running vllm serve; --vllm-container names others), and the manifest has none:%s", strings.Join(seen, ""))
	}
	return out.Bytes(), objs, nil
}

// injectDocument equips the objects of one document: its text as it was
// when none is equipped, else the document rewritten.
func injectDocument(s segment, o Options) (text []byte, objs []Object, err error) {
	where := fmt.Sprintf("document %d (line %d)", s.doc, s.line)
	// The YAML library assumes well-formed objects in places (a field's
	// value of an unexpected kind can panic it): malformed input is an
	// error, never a crash.
	defer func() {
		if r := recover(); r != nil {
			text, objs, err = nil, nil, fmt.Errorf("%s: malformed: %v", where, r)
		}
	}()
	doc, err := parseDocument(s.text)
	if err != nil {
		// Again with the lines before it, so that the parser's line
		// numbers are the file's.
		if _, e := parseDocument(append(bytes.Repeat([]byte("\n"), s.line-1), s.text...)); e != nil {
			err = e
		}
		return nil, nil, fmt.Errorf("%s: %w", where, err)
	}
	n := yaml.NewRNode(doc)
	switch {
	case yaml.IsMissingOrNull(n):
		return s.text, nil, nil // an empty document, as kubectl skips it
	case n.YNode().Kind != yaml.MappingNode:
		return nil, nil, fmt.Errorf("%s: not an object (a YAML mapping)", where)
	}
	changed := false
	if items := n.Field("items"); items != nil && strings.HasSuffix(n.GetKind(), "List") {
		// kubectl get -o yaml: each item is an object.
		if items.Value.YNode().Kind != yaml.SequenceNode {
			return nil, nil, fmt.Errorf("%s: %s: items is not a list", where, objectID(n, s.doc))
		}
		for i, item := range items.Value.Content() {
			in := yaml.NewRNode(item)
			id := fmt.Sprintf("item %d of the %s in document %d", i+1, n.GetKind(), s.doc)
			if item.Kind != yaml.MappingNode {
				return nil, nil, fmt.Errorf("%s: not an object (a YAML mapping)", id)
			}
			if kind, name := in.GetKind(), in.GetName(); kind != "" && name != "" {
				id = fmt.Sprintf("%s/%s (%s)", kind, name, id)
			}
			ob, err := injectObject(in, id, o)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", id, err)
			}
			changed = changed || ob.Equipped
			objs = append(objs, ob)
		}
		if len(objs) == 0 {
			objs = append(objs, Object{ID: objectID(n, s.doc), Detail: "an empty list"})
		}
	} else {
		id := objectID(n, s.doc)
		ob, err := injectObject(n, id, o)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", id, err)
		}
		changed = ob.Equipped
		objs = append(objs, ob)
	}
	for i := range objs {
		objs[i].Doc = s.doc
	}
	if !changed {
		return s.text, objs, nil
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	if err := enc.Encode(doc); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", where, err)
	}
	if err := enc.Close(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", where, err)
	}
	return b.Bytes(), objs, nil
}

// parseDocument parses one document's body, its aliases expanded (so that
// a change to one place changes no other).
func parseDocument(text []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(text))
	doc := &yaml.Node{}
	if err := dec.Decode(doc); err != nil {
		return nil, err
	}
	if err := dec.Decode(&yaml.Node{}); err != io.EOF {
		return nil, errors.New("more than one YAML document between separators")
	}
	if err := checkAliases(doc); err != nil {
		return nil, err
	}
	n := yaml.NewRNode(doc)
	if err := n.DeAnchor(); err != nil {
		return nil, err
	}
	return n.Document(), nil
}

// checkAliases refuses aliases that cannot be expanded: one inside the
// node it refers to, or ones expanding a document to many times its size
// (a "billion laughs").
func checkAliases(doc *yaml.Node) error {
	unique := 0
	var count func(n *yaml.Node)
	count = func(n *yaml.Node) {
		unique++
		for _, c := range n.Content {
			count(c)
		}
	}
	count(doc)
	limit := 4*unique + 10000
	memo := map[*yaml.Node]int{}
	inside := map[*yaml.Node]bool{}
	var size func(n *yaml.Node) (int, error)
	size = func(n *yaml.Node) (int, error) {
		if n == nil {
			return 0, nil
		}
		if inside[n] {
			return 0, fmt.Errorf("line %d: the anchor &%s is used inside itself", n.Line, n.Anchor)
		}
		if s, ok := memo[n]; ok {
			return s, nil
		}
		inside[n] = true
		defer delete(inside, n)
		total := 1
		for _, c := range append(slices.Clip(n.Content), n.Alias) {
			s, err := size(c)
			if err != nil {
				return 0, err
			}
			if total += s; total > limit {
				return 0, fmt.Errorf("its aliases expand it to more than %d nodes, from %d", limit, unique)
			}
		}
		memo[n] = total
		return total, nil
	}
	_, err := size(doc)
	return err
}

// objectID names the object of document doc: Kind/name, or its position.
func objectID(n *yaml.RNode, doc int) string {
	kind, name := n.GetKind(), n.GetName()
	switch {
	case kind != "" && name != "":
		return kind + "/" + name
	case kind != "":
		return fmt.Sprintf("%s (document %d, no name)", kind, doc)
	}
	return fmt.Sprintf("document %d", doc)
}

// template is a pod template of a workload.
type template struct {
	name string // as the report names it: "" for a workload's only one
	path []string
	node *yaml.RNode
}

// podKinds run pods but are not workloads inject equips.
var podKinds = []string{"Pod", "ReplicaSet", "DaemonSet", "Job", "CronJob", "ReplicationController", "PodTemplate"}

// templates returns the pod templates of a workload inject equips, or why
// the object is not one.
func templates(n *yaml.RNode) ([]template, string, error) {
	kind, api := n.GetKind(), n.GetApiVersion()
	lookup := func(name string, required bool, path ...string) (*template, error) {
		t, err := n.Pipe(yaml.Lookup(path...))
		switch {
		case err != nil:
			return nil, err
		case t == nil && !required:
			return nil, nil
		case t == nil || t.YNode().Kind != yaml.MappingNode:
			return nil, fmt.Errorf("no %s (a pod template)", strings.Join(path, "."))
		}
		return &template{name: name, path: path, node: t}, nil
	}
	switch {
	case (kind == "Deployment" || kind == "StatefulSet") && api == "apps/v1":
		t, err := lookup("", true, "spec", "template")
		if err != nil {
			return nil, "", err
		}
		return []template{*t}, "", nil
	case kind == "LeaderWorkerSet" && api == "leaderworkerset.x-k8s.io/v1":
		leader, err := lookup("leaderTemplate", false, "spec", "leaderWorkerTemplate", "leaderTemplate")
		if err != nil {
			return nil, "", err
		}
		worker, err := lookup("workerTemplate", true, "spec", "leaderWorkerTemplate", "workerTemplate")
		if err != nil {
			return nil, "", err
		}
		if leader == nil {
			// LWS runs the leader from the worker template too.
			worker.name = "workerTemplate (the leader's too)"
			return []template{*worker}, "", nil
		}
		return []template{*leader, *worker}, "", nil
	case kind == "Deployment" || kind == "StatefulSet":
		return nil, fmt.Sprintf("apiVersion %q: inject equips apps/v1 %ss", api, kind), nil
	case kind == "LeaderWorkerSet":
		return nil, fmt.Sprintf("apiVersion %q: inject equips leaderworkerset.x-k8s.io/v1 LeaderWorkerSets", api), nil
	case slices.Contains(podKinds, kind):
		return nil, "not a workload inject equips (Deployment, StatefulSet, LeaderWorkerSet)", nil
	case kind == "":
		return nil, "no kind: not a Kubernetes object", nil
	}
	return nil, "not a workload", nil
}

// injectObject equips a workload's pod templates that run a vLLM server.
func injectObject(n *yaml.RNode, id string, o Options) (Object, error) {
	ts, why, err := templates(n)
	if err != nil {
		return Object{}, err
	}
	if ts == nil {
		return Object{ID: id, Detail: why}, nil
	}
	plans := make([][]rank, len(ts))
	notes := make([]string, len(ts))
	equip := false
	for i, t := range ts {
		where := strings.Join(t.path, ".")
		if plans[i], notes[i], err = planTemplate(t.node, where, o); err != nil {
			if t.name != "" {
				return Object{}, fmt.Errorf("%s: %w", t.name, err)
			}
			return Object{}, err
		}
		equip = equip || plans[i] != nil
	}
	var detail []string
	for i, t := range ts {
		if plans[i] != nil {
			if err := equipTemplate(t.node, plans[i], o); err != nil {
				return Object{}, err
			}
			notes[i] = rankDetail(plans[i])
		} else if equip {
			notes[i] = "unchanged, " + notes[i]
		}
		if t.name != "" {
			notes[i] = t.name + ": " + notes[i]
		}
		detail = append(detail, notes[i])
	}
	return Object{ID: id, Equipped: equip, Detail: strings.Join(detail, "; ")}, nil
}

// rankDetail describes the vLLM servers equipped in a pod template.
func rankDetail(ranks []rank) string {
	var names []string
	for _, r := range ranks {
		names = append(names, name(r.c))
	}
	if len(ranks) == 1 {
		return fmt.Sprintf("1 rank (container %s), port %d", names[0], ranks[0].port)
	}
	return fmt.Sprintf("%d ranks (containers %s), ports %d-%d", len(ranks), strings.Join(names, ", "), ranks[0].port, ranks[0].port+len(ranks)-1)
}

// equipTemplate adds the sidecar to a pod template and kvroute's flags and
// settings to its vLLM servers.
func equipTemplate(t *yaml.RNode, ranks []rank, o Options) error {
	dp, port := len(ranks), ranks[0].port
	for _, r := range ranks {
		if err := r.addFlags(); err != nil {
			return err
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
	spec, err := t.Pipe(yaml.Lookup("spec"))
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
	labels, err := t.Pipe(yaml.LookupCreate(yaml.MappingNode, "metadata", "labels"))
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
	containers, err := spec.Pipe(yaml.Lookup("containers"))
	if err != nil {
		return err
	}
	elems, err := containers.Elements()
	if err != nil {
		return err
	}
	if i := slices.IndexFunc(elems, func(e *yaml.RNode) bool { return name(e) == SidecarName }); i >= 0 {
		containers.YNode().Content[i] = sc.YNode()
	} else if err := containers.PipeE(yaml.Append(sc.YNode())); err != nil {
		return err
	}
	volumes, err := spec.Pipe(yaml.LookupCreate(yaml.SequenceNode, "volumes"))
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
