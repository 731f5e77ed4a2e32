// Package inject adds the kvroute sidecar to vLLM Deployment manifests, as
// `kvroute inject` does (the way `istioctl kube-inject` adds Envoy).
//
// Contract:
//   - Inject takes YAML (one or more documents), every one an apps/v1
//     Deployment with a vLLM container, and returns it with: the
//     kvroute-sidecar container; on the vLLM container the flags the
//     sidecar needs (--kv-events-config with a wildcard PUB endpoint and a
//     replay endpoint, --enable-prompt-tokens-details, and
//     --data-parallel-size when the sidecar is told of more ranks than vLLM
//     was) and a fixed PYTHONHASHSEED; the pod labels of the kvroute gossip
//     pool; and the gossip key volume. It is the same sidecar the kustomize
//     component (deploy/components/sidecar) adds.
//   - Idempotent: injecting its own output changes nothing. Existing
//     settings are kept; contradictions (another --kv-events-config, a
//     different data-parallel size) are errors, not silent rewrites.
//   - Errors name the object (Kind/name, or the document's position).
//   - Comments and field order of the input are kept.
//   - Pure: no I/O; the command reads and writes the files.
package inject
