// Package inject adds the kvroute sidecar to the vLLM workloads of a
// Kubernetes manifest, as `kvroute inject` does (the way `istioctl
// kube-inject` adds Envoy).
//
// Contract:
//   - Inject takes a manifest (YAML, one or more documents) and returns it
//     with each vLLM workload equipped: apps/v1 Deployments and
//     StatefulSets (spec.template) and leaderworkerset.x-k8s.io/v1
//     LeaderWorkerSets (spec.leaderWorkerTemplate's leaderTemplate and
//     workerTemplate; without a leaderTemplate the workerTemplate is the
//     leader's too). A pod template is equipped when it has a serving vLLM
//     container — or one per data-parallel rank (container r:
//     --data-parallel-rank r, --port base+r); containers running a Ray
//     worker (multi-node-serving.sh worker, ray start) or vllm serve
//     --headless serve no API and stay as they are. An equipped template
//     gets: the kvroute-sidecar container; on each vLLM server the flags
//     the sidecar needs (--kv-events-config with a wildcard PUB endpoint and
//     a replay endpoint, --enable-prompt-tokens-details), a fixed
//     PYTHONHASHSEED and VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (the Responses
//     render endpoint), a preStop sleep; the pod labels of the kvroute
//     gossip pool; and the gossip key volume. It is the same sidecar the
//     kustomize component (deploy/components/sidecar) adds.
//   - vLLM containers: named vllm or vllm-…, running a vllm image, or
//     running `vllm serve` or vLLM's API server; with
//     Options.VLLMContainers, exactly the containers so named, in pod
//     order. vLLM serves on its --port, else Options.EnginePort, else 8000;
//     a --port contradicting EnginePort is an error.
//   - Commands: given as lists, the flags are appended to args. From a
//     shell script (sh, bash: `command: ["/bin/sh", "-c"]`, options such as
//     -ec, -lc) parsed with a real shell parser, the script's vLLM command
//     — `vllm serve …` or `python… -m vllm.entrypoints.openai.api_server
//     …`, after exec or VAR=value at most — must be a simple command and
//     the script's last (setup commands before it joined by ;, && or
//     newlines); the flags, shell-quoted, go after its last word, and the
//     rest of the script stays byte for byte. Anything else is refused,
//     saying why: the vLLM command piped, backgrounded, redirected,
//     nested (subshell, group, if, loop, case, function, substitution),
//     not last, run twice, missing from a vLLM-like container's script; a
//     script that does not parse; a value inject reads (--port,
//     --kv-events-config, data-parallel flags) known only when the pod
//     starts ($VAR, Kubernetes' $(VAR)).
//   - Everything else passes through byte for byte: objects of other kinds,
//     workloads with no serving vLLM container, and the text between
//     documents (separators, comments, blank lines), in order. Only an
//     equipped document is rewritten (its comments and field order kept,
//     its formatting the YAML encoder's). The items of a List (kubectl get
//     -o yaml) are objects; a List with one equipped is rewritten whole.
//   - InjectReport also says, for each object in order, what was equipped
//     or why it passed through. A manifest with nothing to equip is an
//     error naming the objects seen; so is a malformed document, named by
//     its position and line, and an alias inside itself or expanding a
//     document many times over.
//   - Idempotent: injecting its own output changes nothing; the sidecar is
//     rewritten each time, so it follows edits to the vLLM containers.
//     Existing vLLM settings are kept; contradictions (another
//     --kv-events-config, several ranks behind one API server, ports
//     colliding with the sidecar's) are errors, not silent rewrites.
//   - Errors name the object (Kind/name, or the document's position), the
//     template and the container.
//   - Pure: no I/O; the command reads and writes the files.
package inject
