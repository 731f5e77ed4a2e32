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
//   - RuleFile writes a PrometheusRule's groups as a plain Prometheus rule
//     file (monitoring/kvroute-rules.yaml is its output, for Prometheus
//     without the Operator and for promtool).
//   - OperatorScrapeJobs writes a ServiceMonitor's scrape jobs as the
//     Prometheus Operator's config generator does (its relabelings, so its
//     target labels: namespace, service, pod, container, endpoint = the
//     port's name, job), for one shard and no scrape class; a field it
//     does not cover is an error, never left out. EndpointsTargets gives
//     the targets Kubernetes service discovery (role endpoints) finds for
//     a pod behind a Service, with their meta labels; OperatorScrapes does
//     both for a kustomization and pods placed at real addresses, so tests
//     can run a real Prometheus, or TargetLabels and SeriesLabels
//     (Prometheus's relabeling and its exported_ rule for clashing labels)
//     in-process, with the labels a cluster would give kvroute's series.
//   - Nothing here talks to a cluster.
package deploy
