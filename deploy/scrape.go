package deploy

import (
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Prometheus Operator turns each endpoint of a ServiceMonitor into a
// Prometheus scrape job: Kubernetes service discovery (role endpoints)
// finds the targets, and relabelings the Operator writes select the
// Service's pods and set the target labels every series of the job then
// carries: namespace, service, pod, container, job and endpoint (the
// scraped port's name). OperatorScrapeJobs writes those jobs as the
// Operator does (its config generator, pkg/prometheus/promcfg.go,
// generateServiceMonitorConfig, for one shard and no scrape class), so a
// test can run a real Prometheus, or Prometheus's relabeling in-process,
// with the labels a cluster would give kvroute's series. It covers the
// ServiceMonitor fields kvroute's manifests use and refuses the others, so
// a manifest that starts using one fails its tests instead of being
// checked against a config the Operator would not write.

// OperatorTargetLabels are the target labels the Operator's relabelings
// set on every series of a ServiceMonitor's job (instance comes from the
// address). A scraped label of the same name is renamed exported_<name>
// unless the job honors labels, which a Prometheus with
// overrideHonorLabels never does: kvroute's metrics use none of them.
var OperatorTargetLabels = []string{"namespace", "service", "pod", "container", "endpoint", "job", "instance"}

// Relabel is one entry of a relabel_configs or metric_relabel_configs list
// as Prometheus's configuration file writes it; unset fields take
// Prometheus's defaults.
type Relabel struct {
	SourceLabels []string `json:"source_labels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	TargetLabel  string   `json:"target_label,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// Config returns r as Prometheus's relabel.Config, defaults filled in and
// validated.
func (r Relabel) Config() (*relabel.Config, error) {
	c := relabel.DefaultRelabelConfig
	c.NameValidationScheme = model.UTF8Validation
	for _, l := range r.SourceLabels {
		c.SourceLabels = append(c.SourceLabels, model.LabelName(l))
	}
	if r.Separator != nil {
		c.Separator = *r.Separator
	}
	if r.Regex != "" {
		re, err := relabel.NewRegexp(r.Regex)
		if err != nil {
			return nil, fmt.Errorf("regex %q: %w", r.Regex, err)
		}
		c.Regex = re
	}
	c.Modulus, c.TargetLabel = r.Modulus, r.TargetLabel
	if r.Replacement != nil {
		c.Replacement = *r.Replacement
	}
	if r.Action != "" {
		c.Action = relabel.Action(strings.ToLower(r.Action))
	}
	if err := c.Validate(model.UTF8Validation); err != nil {
		return nil, err
	}
	return &c, nil
}

// ScrapeJob is one scrape_configs entry as the Operator writes it for a
// ServiceMonitor endpoint, less its service discovery (the caller adds
// targets: kubernetes_sd_configs in a cluster; file or static targets
// carrying the same meta labels in a test, see EndpointsTargets).
type ScrapeJob struct {
	JobName        string    `json:"job_name"`
	HonorLabels    bool      `json:"honor_labels,omitempty"`
	ScrapeInterval string    `json:"scrape_interval,omitempty"`
	ScrapeTimeout  string    `json:"scrape_timeout,omitempty"`
	MetricsPath    string    `json:"metrics_path,omitempty"`
	Scheme         string    `json:"scheme,omitempty"`
	Relabel        []Relabel `json:"relabel_configs"`
	MetricRelabel  []Relabel `json:"metric_relabel_configs,omitempty"`
}

// shardKeep is the regex of the Operator's sharding keep rule once its
// config reloader has put the shard (0 of 1) in place of $(SHARD).
const shardKeep = "0;|.+;.+"

// OperatorScrapeJobs returns the scrape jobs the Operator writes for sm,
// one per endpoint, for a Prometheus with one shard, no scrape class, no
// Prometheus-level podTargetLabels or enforced namespace label, the
// endpoints discovery role, and overrideHonorLabels as given. A field of
// sm the rendition does not cover is an error; namespaceSelector is not
// one of them: it only chooses where discovery looks, and the caller
// gives the targets.
func OperatorScrapeJobs(sm *monitoringv1.ServiceMonitor, overrideHonorLabels bool) ([]ScrapeJob, error) {
	if err := coveredSpec(sm.Spec); err != nil {
		return nil, fmt.Errorf("ServiceMonitor %s: %w", sm.Name, err)
	}
	var out []ScrapeJob
	for i, ep := range sm.Spec.Endpoints {
		if err := coveredEndpoint(ep); err != nil {
			return nil, fmt.Errorf("ServiceMonitor %s endpoint %d: %w", sm.Name, i, err)
		}
		job := ScrapeJob{JobName: fmt.Sprintf("serviceMonitor/%s/%s/%d", sm.Namespace, sm.Name, i),
			HonorLabels: ep.HonorLabels && !overrideHonorLabels, ScrapeInterval: string(ep.Interval),
			ScrapeTimeout: string(ep.ScrapeTimeout), MetricsPath: ep.Path}
		if ep.Scheme != nil {
			job.Scheme = strings.ToLower(string(*ep.Scheme))
		}
		rs, err := operatorRelabelings(sm, ep)
		if err != nil {
			return nil, fmt.Errorf("ServiceMonitor %s endpoint %d: %w", sm.Name, i, err)
		}
		job.Relabel = rs
		job.MetricRelabel = fromOperator(ep.MetricRelabelConfigs)
		out = append(out, job)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("ServiceMonitor %s: no endpoints", sm.Name)
	}
	return out, nil
}

// operatorRelabelings are the relabel_configs of one endpoint's job, in
// the Operator's order.
func operatorRelabelings(sm *monitoringv1.ServiceMonitor, ep monitoringv1.Endpoint) ([]Relabel, error) {
	s := func(v string) *string { return &v }
	rs := []Relabel{{SourceLabels: []string{"job"}, TargetLabel: "__tmp_prometheus_job_name"}}
	for _, k := range slices.Sorted(maps.Keys(sm.Spec.Selector.MatchLabels)) {
		rs = append(rs, Relabel{Action: "keep", SourceLabels: serviceLabel(k), Regex: "(" + sm.Spec.Selector.MatchLabels[k] + ");true"})
	}
	for _, e := range sm.Spec.Selector.MatchExpressions {
		switch e.Operator {
		case metav1.LabelSelectorOpIn:
			rs = append(rs, Relabel{Action: "keep", SourceLabels: serviceLabel(e.Key), Regex: "(" + strings.Join(e.Values, "|") + ");true"})
		case metav1.LabelSelectorOpNotIn:
			rs = append(rs, Relabel{Action: "drop", SourceLabels: serviceLabel(e.Key), Regex: "(" + strings.Join(e.Values, "|") + ");true"})
		case metav1.LabelSelectorOpExists:
			rs = append(rs, Relabel{Action: "keep", SourceLabels: serviceLabel(e.Key)[1:], Regex: "true"})
		case metav1.LabelSelectorOpDoesNotExist:
			rs = append(rs, Relabel{Action: "drop", SourceLabels: serviceLabel(e.Key)[1:], Regex: "true"})
		default:
			return nil, fmt.Errorf("selector operator %q", e.Operator)
		}
	}
	switch {
	case ep.Port != "":
		rs = append(rs, Relabel{Action: "keep", SourceLabels: []string{"__meta_kubernetes_endpoint_port_name"}, Regex: ep.Port})
	case ep.TargetPort != nil && ep.TargetPort.StrVal != "":
		rs = append(rs, Relabel{Action: "keep", SourceLabels: []string{"__meta_kubernetes_pod_container_port_name"}, Regex: ep.TargetPort.StrVal})
	case ep.TargetPort != nil && ep.TargetPort.IntVal != 0:
		rs = append(rs, Relabel{Action: "keep", SourceLabels: []string{"__meta_kubernetes_pod_container_port_number"}, Regex: fmt.Sprint(ep.TargetPort.IntVal)})
	}
	kind := []string{"__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"}
	rs = append(rs,
		Relabel{SourceLabels: kind, Separator: s(";"), Regex: "Node;(.*)", Replacement: s("${1}"), TargetLabel: "node"},
		Relabel{SourceLabels: kind, Separator: s(";"), Regex: "Pod;(.*)", Replacement: s("${1}"), TargetLabel: "pod"},
		Relabel{SourceLabels: []string{"__meta_kubernetes_namespace"}, TargetLabel: "namespace"},
		Relabel{SourceLabels: []string{"__meta_kubernetes_service_name"}, TargetLabel: "service"},
		Relabel{SourceLabels: []string{"__meta_kubernetes_pod_name"}, TargetLabel: "pod"},
		Relabel{SourceLabels: []string{"__meta_kubernetes_pod_container_name"}, TargetLabel: "container"})
	if ep.FilterRunning == nil || *ep.FilterRunning {
		rs = append(rs, Relabel{Action: "drop", SourceLabels: []string{"__meta_kubernetes_pod_phase"}, Regex: "(Failed|Succeeded)"})
	}
	for _, l := range sm.Spec.TargetLabels {
		rs = append(rs, Relabel{SourceLabels: []string{"__meta_kubernetes_service_label_" + sanitizeLabel(l)}, TargetLabel: sanitizeLabel(l), Regex: "(.+)", Replacement: s("${1}")})
	}
	for _, l := range sm.Spec.PodTargetLabels {
		rs = append(rs, Relabel{SourceLabels: []string{"__meta_kubernetes_pod_label_" + sanitizeLabel(l)}, TargetLabel: sanitizeLabel(l), Regex: "(.+)", Replacement: s("${1}")})
	}
	rs = append(rs, Relabel{SourceLabels: []string{"__meta_kubernetes_service_name"}, TargetLabel: "job", Replacement: s("${1}")})
	if sm.Spec.JobLabel != "" {
		rs = append(rs, Relabel{SourceLabels: []string{"__meta_kubernetes_service_label_" + sanitizeLabel(sm.Spec.JobLabel)}, TargetLabel: "job", Regex: "(.+)", Replacement: s("${1}")})
	}
	switch {
	case ep.Port != "":
		rs = append(rs, Relabel{TargetLabel: "endpoint", Replacement: s(ep.Port)})
	case ep.TargetPort != nil && ep.TargetPort.String() != "":
		rs = append(rs, Relabel{TargetLabel: "endpoint", Replacement: s(ep.TargetPort.String())})
	}
	rs = append(rs, fromOperator(ep.RelabelConfigs)...)
	return append(rs, // sharding, one shard
		Relabel{SourceLabels: []string{"__address__", "__tmp_hash"}, TargetLabel: "__tmp_hash", Regex: "(.+);", Replacement: s("$1"), Action: "replace"},
		Relabel{SourceLabels: []string{"__tmp_hash"}, TargetLabel: "__tmp_hash", Modulus: 1, Action: "hashmod"},
		Relabel{SourceLabels: []string{"__tmp_hash", "__tmp_disable_sharding"}, Regex: shardKeep, Action: "keep"}), nil
}

// serviceLabel is the pair of meta labels a selector on a Service label
// reads: its value and whether it is present.
func serviceLabel(k string) []string {
	return []string{"__meta_kubernetes_service_label_" + sanitizeLabel(k), "__meta_kubernetes_service_labelpresent_" + sanitizeLabel(k)}
}

// fromOperator converts a ServiceMonitor's relabelings as the Operator
// writes them (the action lower-cased, unset fields left out).
func fromOperator(rc []monitoringv1.RelabelConfig) []Relabel {
	var out []Relabel
	for _, c := range rc {
		r := Relabel{Separator: c.Separator, TargetLabel: c.TargetLabel, Regex: c.Regex, Replacement: c.Replacement, Action: strings.ToLower(c.Action)}
		if c.Modulus > 0 {
			r.Modulus = uint64(c.Modulus)
		}
		for _, l := range c.SourceLabels {
			r.SourceLabels = append(r.SourceLabels, string(l))
		}
		out = append(out, r)
	}
	return out
}

var invalidLabelChar = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// sanitizeLabel is a Kubernetes label key as service discovery and the
// Operator write it in a meta label's name.
func sanitizeLabel(k string) string { return invalidLabelChar.ReplaceAllString(k, "_") }

// coveredSpec refuses a ServiceMonitor spec that sets a field the
// rendition leaves out.
func coveredSpec(spec monitoringv1.ServiceMonitorSpec) error {
	rest := spec
	rest.JobLabel, rest.TargetLabels, rest.PodTargetLabels, rest.Endpoints = "", nil, nil, nil
	rest.Selector, rest.NamespaceSelector = metav1.LabelSelector{}, monitoringv1.NamespaceSelector{}
	if rest.SelectorMechanism != nil && *rest.SelectorMechanism == monitoringv1.SelectorMechanismRelabel {
		rest.SelectorMechanism = nil
	}
	if !reflect.DeepEqual(rest, monitoringv1.ServiceMonitorSpec{}) {
		return fmt.Errorf("sets a field the Operator rendition (deploy.OperatorScrapeJobs) does not cover: %+v", rest)
	}
	return nil
}

// coveredEndpoint refuses an endpoint that sets a field the rendition
// leaves out (TLS, authorization, params, proxies, …).
func coveredEndpoint(ep monitoringv1.Endpoint) error {
	rest := ep
	rest.Port, rest.TargetPort, rest.Path, rest.Scheme, rest.Interval, rest.ScrapeTimeout = "", nil, "", nil, "", ""
	rest.HonorLabels, rest.RelabelConfigs, rest.MetricRelabelConfigs, rest.FilterRunning = false, nil, nil, nil
	if !reflect.DeepEqual(rest, monitoringv1.Endpoint{}) {
		return fmt.Errorf("sets a field the Operator rendition (deploy.OperatorScrapeJobs) does not cover: %+v", rest)
	}
	if ep.Port == "" && ep.TargetPort == nil {
		return fmt.Errorf("neither port nor targetPort")
	}
	return nil
}

// TargetLabels returns the labels Prometheus gives a target of job that
// service discovery found with the labels meta (__address__ and the
// __meta_* labels): job's relabelings applied, then instance from the
// address when unset, then every label starting with __ dropped. It
// reports false when the relabelings drop the target.
func TargetLabels(job ScrapeJob, meta map[string]string) (map[string]string, bool, error) {
	in := maps.Clone(meta)
	in["job"] = job.JobName
	in["__scheme__"], in["__metrics_path__"] = "http", "/metrics"
	if job.Scheme != "" {
		in["__scheme__"] = job.Scheme
	}
	if job.MetricsPath != "" {
		in["__metrics_path__"] = job.MetricsPath
	}
	ls, keep, err := relabelAll(job.JobName+" relabel_configs", job.Relabel, in)
	if err != nil || !keep {
		return nil, false, err
	}
	out := map[string]string{}
	ls.Range(func(l labels.Label) {
		if !strings.HasPrefix(l.Name, "__") {
			out[l.Name] = l.Value
		}
	})
	if out["instance"] == "" {
		out["instance"] = ls.Get("__address__")
	}
	return out, true, nil
}

// SeriesLabels returns the labels Prometheus stores for a series scraped
// with labels scraped from a target of job whose labels are target (from
// TargetLabels), as its scrape loop does: with honor_labels false (the
// default, and always under overrideHonorLabels) each target label wins
// and a scraped label of the same name moves to exported_<name>
// (exported_exported_<name> if that is taken); with honor_labels true the
// scraped label wins. Then job's metric relabelings apply; false means
// they dropped the series.
func SeriesLabels(job ScrapeJob, target, scraped map[string]string) (map[string]string, bool, error) {
	out := maps.Clone(scraped)
	var conflicts []labels.Label
	for _, name := range slices.Sorted(maps.Keys(target)) {
		if v := out[name]; v != "" {
			if job.HonorLabels {
				continue
			}
			conflicts = append(conflicts, labels.Label{Name: name, Value: v})
		}
		out[name] = target[name]
	}
	slices.SortStableFunc(conflicts, func(a, b labels.Label) int { return len(a.Name) - len(b.Name) })
	for _, c := range conflicts {
		moved := c.Name
		for {
			moved = model.ExportedLabelPrefix + moved
			if out[moved] == "" {
				out[moved] = c.Value
				break
			}
		}
	}
	if len(job.MetricRelabel) == 0 {
		return out, true, nil
	}
	ls, keep, err := relabelAll(job.JobName+" metric_relabel_configs", job.MetricRelabel, out)
	if err != nil || !keep {
		return nil, false, err
	}
	return ls.Map(), true, nil
}

// relabelAll applies rs to in with Prometheus's relabeling; false means
// they dropped it. where names the list in errors.
func relabelAll(where string, rs []Relabel, in map[string]string) (labels.Labels, bool, error) {
	cfgs := make([]*relabel.Config, 0, len(rs))
	for i, r := range rs {
		c, err := r.Config()
		if err != nil {
			return labels.EmptyLabels(), false, fmt.Errorf("%s[%d]: %w", where, i, err)
		}
		cfgs = append(cfgs, c)
	}
	lb := labels.NewBuilder(labels.FromMap(in))
	if !relabel.ProcessBuilder(lb, cfgs...) {
		return labels.EmptyLabels(), false, nil
	}
	return lb.Labels(), true, nil
}
