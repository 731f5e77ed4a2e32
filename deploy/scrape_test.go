package deploy

import (
	"maps"
	"reflect"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestOperatorTargetLabels: the example fleet with monitoring, its picker
// and vLLM pods placed, gives each admin port exactly the target labels
// the Operator's relabelings set (endpoint is the port's name, job the
// ServiceMonitor's jobLabel), and drops the other ports' targets.
func TestOperatorTargetLabels(t *testing.T) {
	scrapes, err := OperatorScrapes("examples/monitoring", []PodAt{
		{Deployment: "kvroute-picker", Name: "kvroute-picker-6c9d-abcde", IP: "10.0.0.7", Addresses: map[string]string{"admin": "127.0.0.1:18081"}},
		{Deployment: "vllm-qwen3", Name: "vllm-qwen3-7f4b-fghij", IP: "10.0.1.5", Addresses: map[string]string{"admin": "127.0.0.1:18090"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]map[string]string{
		"serviceMonitor/llm/kvroute-picker/0": {{"namespace": "llm", "service": "kvroute-picker-admin", "pod": "kvroute-picker-6c9d-abcde",
			"container": "picker", "endpoint": "admin", "job": "kvroute-picker-admin", "instance": "127.0.0.1:18081"}},
		"serviceMonitor/llm/kvroute-sidecars/0": {{"namespace": "llm", "service": "kvroute-sidecars", "pod": "vllm-qwen3-7f4b-fghij",
			"container": "kvroute-sidecar", "endpoint": "admin", "job": "kvroute-sidecars", "instance": "127.0.0.1:18090"}},
	}
	got := map[string][]map[string]string{}
	for _, s := range scrapes {
		if s.Job.HonorLabels || s.Job.MetricsPath != "/metrics" {
			t.Errorf("%s: honor_labels %v, metrics_path %q", s.Job.JobName, s.Job.HonorLabels, s.Job.MetricsPath)
		}
		kept := 0
		for _, meta := range s.Targets {
			ls, keep, err := TargetLabels(s.Job, meta)
			if err != nil {
				t.Fatal(err)
			}
			if keep {
				kept++
				got[s.Job.JobName] = append(got[s.Job.JobName], ls)
			}
		}
		if kept == len(s.Targets) && s.Job.JobName == "serviceMonitor/llm/kvroute-sidecars/0" {
			t.Errorf("%s: the grpc port's target was not dropped", s.Job.JobName)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("target labels:\n got %v\nwant %v", got, want)
	}
	for _, ls := range got {
		for _, l := range OperatorTargetLabels {
			if _, ok := ls[0][l]; !ok {
				t.Errorf("OperatorTargetLabels names %s, which the Operator's relabelings did not set: %v", l, ls[0])
			}
		}
		if len(ls[0]) != len(OperatorTargetLabels) {
			t.Errorf("target labels %v, want exactly %v", ls[0], OperatorTargetLabels)
		}
	}
}

// TestOperatorJobLabel: without jobLabel the job is the Service's name,
// which a kustomize namePrefix changes; with it, the Service's label.
func TestOperatorJobLabel(t *testing.T) {
	meta := map[string]string{"__address__": "10.0.0.7:8081", "__meta_kubernetes_namespace": "llm",
		"__meta_kubernetes_service_name": "team-a-kvroute-picker-admin", "__meta_kubernetes_endpoint_port_name": "admin",
		"__meta_kubernetes_service_label_app_kubernetes_io_name": "kvroute-picker-admin", "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name": "true",
		"__meta_kubernetes_endpoint_address_target_kind": "Pod", "__meta_kubernetes_endpoint_address_target_name": "p", "__meta_kubernetes_pod_name": "p",
		"__meta_kubernetes_pod_container_name": "picker", "__meta_kubernetes_pod_phase": "Running"}
	sm := &monitoringv1.ServiceMonitor{ObjectMeta: metav1.ObjectMeta{Name: "kvroute-picker", Namespace: "llm"}, Spec: monitoringv1.ServiceMonitorSpec{
		Selector:  metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "kvroute-picker-admin"}},
		Endpoints: []monitoringv1.Endpoint{{Port: "admin"}}}}
	for _, c := range []struct{ jobLabel, want string }{{"", "team-a-kvroute-picker-admin"}, {"app.kubernetes.io/name", "kvroute-picker-admin"}} {
		sm.Spec.JobLabel = c.jobLabel
		jobs, err := OperatorScrapeJobs(sm, false)
		if err != nil {
			t.Fatal(err)
		}
		ls, keep, err := TargetLabels(jobs[0], meta)
		if err != nil || !keep || ls["job"] != c.want {
			t.Errorf("jobLabel %q: %v %v %v, want job %s", c.jobLabel, ls, keep, err, c.want)
		}
	}
	// A Service without the selected label is not scraped at all.
	other := maps.Clone(meta)
	other["__meta_kubernetes_service_label_app_kubernetes_io_name"] = "something-else"
	jobs, _ := OperatorScrapeJobs(sm, false)
	if _, keep, _ := TargetLabels(jobs[0], other); keep {
		t.Error("a Service the selector does not match was kept")
	}
}

// TestSeriesLabels: Prometheus's conflict rule between scraped labels and
// target labels, and metric relabelings after it.
func TestSeriesLabels(t *testing.T) {
	target := map[string]string{"endpoint": "admin", "job": "kvroute-sidecars", "pod": "vllm-0"}
	for _, c := range []struct {
		name    string
		honor   bool
		scraped map[string]string
		want    map[string]string
	}{
		{"no conflict", false, map[string]string{"engine": "http://e:8000"},
			map[string]string{"engine": "http://e:8000", "endpoint": "admin", "job": "kvroute-sidecars", "pod": "vllm-0"}},
		{"the old label: renamed", false, map[string]string{"endpoint": "http://e:8000"},
			map[string]string{"exported_endpoint": "http://e:8000", "endpoint": "admin", "job": "kvroute-sidecars", "pod": "vllm-0"}},
		{"exported_ taken too", false, map[string]string{"endpoint": "http://e:8000", "exported_endpoint": "x"},
			map[string]string{"exported_exported_endpoint": "http://e:8000", "exported_endpoint": "x", "endpoint": "admin", "job": "kvroute-sidecars", "pod": "vllm-0"}},
		{"empty scraped value: no conflict", false, map[string]string{"endpoint": ""},
			map[string]string{"endpoint": "admin", "job": "kvroute-sidecars", "pod": "vllm-0"}},
		{"honored", true, map[string]string{"endpoint": "http://e:8000"},
			map[string]string{"endpoint": "http://e:8000", "job": "kvroute-sidecars", "pod": "vllm-0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, keep, err := SeriesLabels(ScrapeJob{JobName: "j", HonorLabels: c.honor}, target, c.scraped)
			if err != nil || !keep || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %v %v %v, want %v", got, keep, err, c.want)
			}
		})
	}
	drop := ScrapeJob{JobName: "j", MetricRelabel: []Relabel{{Action: "drop", SourceLabels: []string{"__name__"}, Regex: "go_.*"}}}
	if _, keep, err := SeriesLabels(drop, target, map[string]string{"__name__": "go_goroutines"}); keep || err != nil {
		t.Fatalf("a metric relabeling's drop: kept %v, %v", keep, err)
	}
}

// TestOperatorScrapeJobsRefuses: a field the rendition does not cover is
// an error, not silently left out.
func TestOperatorScrapeJobsRefuses(t *testing.T) {
	sel := metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
	limit := int64(10)
	for name, sm := range map[string]monitoringv1.ServiceMonitorSpec{
		"sample limit":   {Selector: sel, SampleLimit: &limit, Endpoints: []monitoringv1.Endpoint{{Port: "admin"}}},
		"endpoint TLS":   {Selector: sel, Endpoints: []monitoringv1.Endpoint{{Port: "admin", Params: map[string][]string{"x": {"y"}}}}},
		"no port":        {Selector: sel, Endpoints: []monitoringv1.Endpoint{{Path: "/metrics"}}},
		"no endpoints":   {Selector: sel},
		"bad expression": {Selector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}, Endpoints: []monitoringv1.Endpoint{{Port: "admin"}}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := OperatorScrapeJobs(&monitoringv1.ServiceMonitor{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: sm}, false)
			if err == nil {
				t.Fatal("no error")
			}
		})
	}
	if _, err := OperatorScrapes("examples/vllm", nil); err != nil {
		t.Fatalf("a kustomization without ServiceMonitors: %v", err)
	}
	if _, err := OperatorScrapes("examples/monitoring", []PodAt{{Deployment: "nope", Name: "x"}}); err == nil || !strings.Contains(err.Error(), "no Deployment nope") {
		t.Fatalf("an unknown Deployment: %v", err)
	}
}
