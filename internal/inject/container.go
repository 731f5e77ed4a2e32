package inject

import (
	"cmp"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// rank is a vLLM server in a pod: its container, how it starts, and its
// HTTP port.
type rank struct {
	c    *yaml.RNode
	cmd  vllmCommand
	port int
}

// vllmCommand is how a vLLM container starts, as inject reads it.
type vllmCommand struct {
	// flags are the vLLM command's words after `vllm serve` (or the
	// module), or, for a command inject does not recognise (the image's
	// entrypoint, a wrapper), all of command and args.
	flags flagList
	// serving: an OpenAI API server with KV events, which the sidecar
	// follows; not a Ray worker or a headless vLLM.
	serving bool
	why     string // why it is not serving
	// script is where the flags go when vLLM runs from a shell script;
	// nil: they are appended to args.
	script *script
}

// Flag spellings vLLM accepts.
var (
	kvEventsFlags = []string{"--kv-events-config", "--kv_events_config"}
	dpSizeFlags   = []string{"--data-parallel-size", "--data_parallel_size", "-dp"}
	dpRankFlags   = []string{"--data-parallel-rank", "--data_parallel_rank", "-dpr"}
	promptFlags   = []string{"--enable-prompt-tokens-details", "--enable_prompt_tokens_details"}
	headlessFlags = []string{"--headless"}
	// valueFlags are the flags inject reads a value of.
	valueFlags = slices.Concat([]string{"--port"}, kvEventsFlags, dpSizeFlags, dpRankFlags)
)

// planTemplate finds a pod template's vLLM servers, checked: none (and
// why) when it runs none.
func planTemplate(t *yaml.RNode, where string, o Options) ([]rank, string, error) {
	containers, err := t.Pipe(yaml.Lookup("spec", "containers"))
	if err != nil || containers == nil || containers.YNode().Kind != yaml.SequenceNode {
		return nil, "", fmt.Errorf("no %s.spec.containers list", where)
	}
	elems, err := containers.Elements()
	if err != nil {
		return nil, "", err
	}
	for i, c := range elems {
		if c.YNode().Kind != yaml.MappingNode {
			return nil, "", fmt.Errorf("%s.spec.containers[%d] is not a container (a mapping)", where, i)
		}
	}
	var ranks []rank
	var idle []string
	found := false
	for _, c := range elems {
		looks := vllmLike(c, o)
		if looks == "" {
			continue
		}
		found = true
		cmd, err := readCommand(c, looks)
		if err != nil {
			return nil, "", fmt.Errorf("container %s: %w", cmp.Or(name(c), "(unnamed)"), err)
		}
		if !cmd.serving {
			idle = append(idle, name(c)+" "+cmd.why)
			continue
		}
		ranks = append(ranks, rank{c: c, cmd: cmd})
	}
	switch {
	case !found && len(o.VLLMContainers) > 0:
		return nil, fmt.Sprintf("no vLLM container (none named %s; containers: %s)", strings.Join(o.VLLMContainers, ", "), containerNames(elems)), nil
	case !found:
		return nil, fmt.Sprintf("no vLLM container (containers: %s)", containerNames(elems)), nil
	case len(ranks) == 0:
		return nil, "no serving vLLM container: " + strings.Join(idle, "; "), nil
	}
	if err := checkRanks(ranks, o); err != nil {
		return nil, "", err
	}
	return ranks, "", nil
}

// vllmLike says why a container is taken for a vLLM one ("" if it is
// not): named with --vllm-container; else named vllm or vllm-…, running a
// vllm image, or running `vllm serve` or vLLM's API server.
func vllmLike(c *yaml.RNode, o Options) string {
	n := name(c)
	if len(o.VLLMContainers) > 0 {
		if slices.Contains(o.VLLMContainers, n) {
			return "named with --vllm-container"
		}
		return ""
	}
	switch img, _ := c.GetString("image"); {
	case n == SidecarName:
		return ""
	case n == "vllm" || strings.HasPrefix(n, "vllm-"):
		return "named " + n
	case strings.Contains(strings.ToLower(img), "vllm"):
		return "image " + img
	}
	cmd, _ := stringList(c, "command")
	args, _ := stringList(c, "args")
	if words := strings.Join(append(cmd, args...), " "); strings.Contains(words, "vllm serve") || strings.Contains(words, "vllm.entrypoints.openai.api_server") {
		return "its command runs vLLM"
	}
	return ""
}

// readCommand reads how a vLLM container starts: its command and args as
// a list (exec form), or a shell script.
func readCommand(c *yaml.RNode, looks string) (vllmCommand, error) {
	command, err := stringList(c, "command")
	if err != nil {
		return vllmCommand{}, err
	}
	args, err := stringList(c, "args")
	if err != nil {
		return vllmCommand{}, err
	}
	words := slices.Concat(command, args)
	shell, at, err := shellScript(words)
	if err != nil {
		return vllmCommand{}, err
	}
	if shell != "" {
		list, i := "command", at
		if at >= len(command) {
			list, i = "args", at-len(command)
		}
		l, _ := c.Pipe(yaml.Lookup(list))
		return readScript(shell, l.YNode().Content[i], looks)
	}
	flags := make(flagList, len(words))
	for i, w := range words {
		// Kubernetes expands $(VAR) in command and args when the pod
		// starts.
		flags[i] = arg{val: w, lit: !strings.Contains(w, "$("), src: w}
	}
	cmd := vllmCommand{flags: flags, serving: true}
	if start, _, ok := recognize(flags); ok {
		cmd.flags = flags[start:]
	} else if rayWorker(flags) {
		return vllmCommand{why: "runs a Ray worker (no API server)"}, nil
	}
	if err := cmd.check(); err != nil {
		return vllmCommand{}, err
	}
	return cmd, nil
}

// check refuses flags inject cannot add to, and notes a headless vLLM.
func (cmd *vllmCommand) check() error {
	// A flag inject reads, last and without its value: the flags added
	// after it would become its value.
	if n := len(cmd.flags); n > 0 && slices.Contains(valueFlags, cmd.flags[n-1].val) {
		f := cmd.flags[n-1].val
		return fmt.Errorf("its flags end with %s, which needs a value (%s=N or %s N)", f, f, f)
	}
	if cmd.flags.has(headlessFlags...) {
		cmd.serving, cmd.why = false, "runs vllm serve --headless (no API server)"
	}
	return nil
}

// recognize finds a vLLM server's command in words: `vllm serve` or
// `python… -m vllm.entrypoints.openai.api_server`, after `exec` or `env
// VAR=value…` at most. start is the index of its first flag.
func recognize(words flagList) (start int, what string, ok bool) {
	i := 0
	for i < len(words) && words[i].lit {
		switch words[i].val {
		case "exec":
			for i++; i < len(words) && words[i].lit && strings.HasPrefix(words[i].val, "-"); i++ {
				if words[i].val == "-a" {
					i++ // exec -a NAME
				}
			}
			continue
		case "env":
			for i++; i < len(words) && words[i].lit && (strings.Contains(words[i].val, "=") || words[i].val == "-i"); i++ {
			}
			continue
		}
		break
	}
	lit := func(j int) string {
		if j < len(words) && words[j].lit {
			return words[j].val
		}
		return ""
	}
	switch cmd := path.Base(lit(i)); {
	case cmd == "vllm" && lit(i+1) == "serve":
		return i + 2, "vllm serve", true
	case python.MatchString(cmd):
		for j := i + 1; j < len(words) && strings.HasPrefix(lit(j), "-"); j++ {
			switch lit(j) {
			case "-m":
				if lit(j+1) == "vllm.entrypoints.openai.api_server" {
					return j + 2, cmd + " -m vllm.entrypoints.openai.api_server", true
				}
				return 0, "", false
			case "-c":
				return 0, "", false
			case "-X", "-W":
				j++
			}
		}
	}
	return 0, "", false
}

var python = regexp.MustCompile(`^python(3(\.[0-9]+)?)?$`)

// rayWorker reports whether words run a Ray worker node: vLLM's
// multi-node-serving.sh worker, or ray start without --head.
func rayWorker(words flagList) bool {
	for i, w := range words {
		if !w.lit {
			continue
		}
		if path.Base(w.val) == "multi-node-serving.sh" && i+1 < len(words) && words[i+1].val == "worker" {
			return true
		}
		if path.Base(w.val) == "ray" && i+1 < len(words) && words[i+1].val == "start" && !words.has("--head") {
			return true
		}
	}
	return false
}

// checkRanks checks a pod's vLLM servers and sets their ports: one, or
// one per data-parallel rank (rank r in container r, on port+r, as the
// sidecar follows them: vLLM's external load balancing). A container
// serving several ranks behind one API server cannot be routed to per
// rank.
func checkRanks(ranks []rank, o Options) error {
	n := len(ranks)
	for i := range ranks {
		r := &ranks[i]
		r.port = cmp.Or(o.EnginePort, defaultVLLMPort)
		if v, ok, err := r.cmd.flags.literal("--port"); err != nil {
			return fmt.Errorf("container %s: %w", name(r.c), err)
		} else if ok {
			if r.port, err = strconv.Atoi(v); err != nil || r.port < 1 || r.port > 65535 {
				return fmt.Errorf("container %s: --port %q", name(r.c), v)
			}
			if o.EnginePort != 0 && r.port != o.EnginePort+i {
				rankNote := ""
				if i > 0 {
					rankNote = fmt.Sprintf(" (rank %d: port %d)", i, o.EnginePort+i)
				}
				return fmt.Errorf("container %s: its --port %d contradicts --engine-port %d%s; drop one", name(r.c), r.port, o.EnginePort, rankNote)
			}
		}
	}
	for i, r := range ranks {
		size, rk := 1, 0
		if v, ok, err := r.cmd.flags.literal(dpSizeFlags...); err != nil {
			return fmt.Errorf("container %s: %w", name(r.c), err)
		} else if ok {
			if size, _ = strconv.Atoi(v); size < 1 {
				return fmt.Errorf("container %s: --data-parallel-size %q", name(r.c), v)
			}
		}
		v, hasRank, err := r.cmd.flags.literal(dpRankFlags...)
		if err != nil {
			return fmt.Errorf("container %s: %w", name(r.c), err)
		}
		if hasRank {
			if rk, _ = strconv.Atoi(v); rk < 0 || strconv.Itoa(rk) != v {
				return fmt.Errorf("container %s: --data-parallel-rank %q", name(r.c), v)
			}
		}
		switch {
		case size > 1 && !hasRank && n == 1:
			return fmt.Errorf("container %s serves %d data-parallel ranks behind one API server; kvroute routes to each rank, so run one vllm serve per rank (container r: --data-parallel-rank r, --port %d+r)", name(r.c), size, r.port)
		case size != n || rk != i:
			return fmt.Errorf("container %s: --data-parallel-size %d, rank %d; with %d vLLM container(s) kvroute expects size %d and rank %d (container order)", name(r.c), size, rk, n, n, i)
		case r.port != ranks[0].port+i:
			return fmt.Errorf("container %s: rank %d on port %d, want %d (rank 0's port + rank)", name(r.c), i, r.port, ranks[0].port+i)
		}
	}
	if o.DataParallelSize != 0 && o.DataParallelSize != n {
		return fmt.Errorf("%d data-parallel rank(s) found (one vLLM container each), but %d was asked for", n, o.DataParallelSize)
	}
	if err := checkPorts(ranks[0].port, n); err != nil {
		return err
	}
	for _, r := range ranks {
		if v, ok, err := r.cmd.flags.literal(kvEventsFlags...); err != nil {
			return fmt.Errorf("container %s: %w", name(r.c), err)
		} else if ok && v != KVEventsConfig {
			return fmt.Errorf("container %s already has --kv-events-config %s; remove it so kvroute's (%s) can be added, or add the sidecar by hand", name(r.c), v, KVEventsConfig)
		}
	}
	return nil
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
	}{{7946, 1, "gossip"}, {8090, 1, "sidecar's admin"}, {9090, 1, "sidecar's gRPC"}, {KVEventsPort, dp, "KV events"}, {ReplayPort, dp, "replay"}} {
		if port < p.at+p.n && p.at < port+dp {
			return fmt.Errorf("vLLM's HTTP ports %d..%d overlap the %s port(s) %d..%d", port, port+dp-1, p.what, p.at, p.at+p.n-1)
		}
	}
	return nil
}

// addFlags gives a vLLM server the flags the sidecar needs that it lacks.
func (r rank) addFlags() error {
	var add []string
	if _, ok := r.cmd.flags.value(kvEventsFlags...); !ok {
		add = append(add, "--kv-events-config="+KVEventsConfig)
	}
	if !r.cmd.flags.has(promptFlags...) {
		add = append(add, promptFlags[0])
	}
	if len(add) == 0 {
		return nil
	}
	if r.cmd.script != nil {
		r.cmd.script.add(add)
		return nil
	}
	args, err := r.c.Pipe(yaml.LookupCreate(yaml.SequenceNode, "args"))
	if err != nil {
		return err
	}
	for _, a := range add {
		if err := args.PipeE(yaml.Append(yaml.NewStringRNode(a).YNode())); err != nil {
			return err
		}
	}
	return nil
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
func stringList(c *yaml.RNode, field string) ([]string, error) {
	l, err := c.Pipe(yaml.Lookup(field))
	if err != nil || l == nil {
		return nil, nil
	}
	if l.YNode().Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("%s is not a list", field)
	}
	var out []string
	for i, e := range l.Content() {
		if e.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("%s[%d] is not a string", field, i)
		}
		out = append(out, e.Value)
	}
	return out, nil
}

// arg is a word of a command line.
type arg struct {
	val string // its value; for a word expanded when the pod starts, the literal part before the expansion
	lit bool   // the whole value is known before the pod starts
	src string // as written
}

// flagList is a vLLM command's words.
type flagList []arg

// value returns the value of the flag under any of its spellings, given as
// --name=v or --name v (the last one wins, as in vLLM).
func (f flagList) value(spellings ...string) (v arg, found bool) {
	for i, a := range f {
		for _, flag := range spellings {
			if val, ok := strings.CutPrefix(a.val, flag+"="); ok {
				v, found = arg{val: val, lit: a.lit, src: a.src}, true
			} else if a.val == flag && a.lit && i+1 < len(f) {
				v, found = f[i+1], true
				v.src = a.src + " " + v.src
			}
		}
	}
	return v, found
}

// literal is value, for a flag whose value inject needs: one known before
// the pod starts.
func (f flagList) literal(spellings ...string) (string, bool, error) {
	v, ok := f.value(spellings...)
	if ok && !v.lit {
		return "", false, fmt.Errorf("%s: inject needs the value of %s, and this one is only known when the pod starts (Kubernetes expands $(VAR), the shell $VAR); write the value itself", v.src, spellings[0])
	}
	return v.val, ok, nil
}

func (f flagList) has(spellings ...string) bool {
	for _, a := range f {
		for _, flag := range spellings {
			if a.val == flag || strings.HasPrefix(a.val, flag+"=") {
				return true
			}
		}
	}
	return false
}
