// Package inject adds the kvroute sidecar to vLLM Deployment manifests, as
// `kvroute inject` does (the way `istioctl kube-inject` adds Envoy).
//
// Contract:
//   - Inject takes YAML (one or more documents), every one an apps/v1
//     Deployment with a vLLM container — or one per data-parallel rank
//     (container r: --data-parallel-rank r, --port base+r) — and returns it
//     with: the kvroute-sidecar container; on each vLLM container the flags
//     the sidecar needs (--kv-events-config with a wildcard PUB endpoint
//     and a replay endpoint, --enable-prompt-tokens-details), a fixed
//     PYTHONHASHSEED and VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (the Responses
//     render endpoint); the pod labels of the kvroute gossip pool; and the
//     gossip key volume. It is the same sidecar the kustomize component
//     (deploy/components/sidecar) adds.
//   - Idempotent: injecting its own output changes nothing; the sidecar is
//     rewritten each time, so it follows edits to the vLLM containers.
//     Existing vLLM settings are kept; contradictions (another
//     --kv-events-config, several ranks behind one API server, ports
//     colliding with the sidecar's, shell-script commands) are errors, not
//     silent rewrites.
//   - Errors name the object (Kind/name, or the document's position).
//   - Comments and field order of the input are kept.
//   - Pure: no I/O; the command reads and writes the files.
package inject
