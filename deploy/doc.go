// Package deploy holds kvroute's Kubernetes manifests (kustomize: base/,
// components/sidecar/, components/gateway/, components/monitoring/,
// components/mtls/, monitoring/, examples/) and builds and reads them for
// tests.
//
// Contract:
//   - Build runs kustomize in-process (sigs.k8s.io/kustomize/api) on a
//     kustomization directory, with kustomize's defaults: no plugins, files
//     only from within the kustomization's own tree.
//   - Decode decodes one built object strictly into its typed form
//     (k8s.io/api, prometheus-operator's ServiceMonitor and PrometheusRule,
//     the Inference Extension's InferencePool v1, Gateway API's HTTPRoute
//     v1): an unknown or misspelt field, a duplicate key or a value of the
//     wrong type is an error, so a manifest that builds but would be
//     rejected or silently misread by the API server fails here.
//   - Alerts reads a PrometheusRule file strictly and returns its alerting
//     rules; MetricNames lists the metrics a parsed PromQL expression
//     selects; DashboardQueries returns every PromQL expression of a
//     Grafana dashboard JSON file, Grafana's variables substituted so each
//     parses.
//   - Nothing here talks to a cluster.
package deploy
