// Package deploy holds kvroute's Kubernetes manifests (kustomize: base/,
// components/sidecar/, components/gateway/, examples/) and builds them for
// tests.
//
// Contract:
//   - Build runs kustomize in-process (sigs.k8s.io/kustomize/api) on a
//     kustomization directory, with kustomize's defaults: no plugins, files
//     only from within the kustomization's own tree.
//   - Decode decodes one built object strictly into its typed form
//     (k8s.io/api, prometheus-operator's ServiceMonitor, the Inference
//     Extension's InferencePool v1, Gateway API's HTTPRoute v1): an unknown or
//     misspelt field, a duplicate key or a value of the wrong type is an
//     error, so a manifest that builds but would be rejected or silently
//     misread by the API server fails here.
//   - Nothing here talks to a cluster.
package deploy
