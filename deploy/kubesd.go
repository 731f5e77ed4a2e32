package deploy

import (
	"fmt"
	"maps"
	"strconv"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	klabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Pod is one pod of a workload as Kubernetes service discovery sees it:
// the workload's pod template, named and placed.
type Pod struct {
	Name, Namespace, IP, Node string
	Template                  corev1.PodTemplateSpec
	// ControllerKind and ControllerName are its owner (a Deployment's
	// pods: ReplicaSet, <deployment>-<hash>).
	ControllerKind, ControllerName string
}

// EndpointsTargets returns the targets Prometheus's Kubernetes service
// discovery (role endpoints, the Operator's default for ServiceMonitors)
// finds for a ready, running pod behind svc: one per Service port, each
// with the meta labels it would carry and __address__ set to
// address[port name], or to the pod's IP and container port when address
// has none. A Service whose selector does not select the pod, or a port
// the pod's containers do not expose, is an error: the Service would list
// no such endpoint.
func EndpointsTargets(svc *corev1.Service, pod Pod, address map[string]string) ([]map[string]string, error) {
	podLabels := pod.Template.Labels
	if len(svc.Spec.Selector) == 0 || !klabels.SelectorFromSet(svc.Spec.Selector).Matches(klabels.Set(podLabels)) {
		return nil, fmt.Errorf("Service %s (selector %v) does not select pod %s (labels %v)", svc.Name, svc.Spec.Selector, pod.Name, podLabels)
	}
	base := map[string]string{
		"__meta_kubernetes_namespace":                    pod.Namespace,
		"__meta_kubernetes_endpoints_name":               svc.Name,
		"__meta_kubernetes_endpoint_ready":               "true",
		"__meta_kubernetes_endpoint_node_name":           pod.Node,
		"__meta_kubernetes_endpoint_address_target_kind": "Pod",
		"__meta_kubernetes_endpoint_address_target_name": pod.Name,
		"__meta_kubernetes_service_name":                 svc.Name,
		"__meta_kubernetes_pod_name":                     pod.Name,
		"__meta_kubernetes_pod_ip":                       pod.IP,
		"__meta_kubernetes_pod_ready":                    "true",
		"__meta_kubernetes_pod_phase":                    "Running",
		"__meta_kubernetes_pod_node_name":                pod.Node,
		"__meta_kubernetes_pod_controller_kind":          pod.ControllerKind,
		"__meta_kubernetes_pod_controller_name":          pod.ControllerName,
		"__meta_kubernetes_pod_container_init":           "false",
	}
	metaLabels(base, "__meta_kubernetes_service", svc.Labels, svc.Annotations)
	// The endpoints controller copies the Service's labels to its Endpoints.
	metaLabels(base, "__meta_kubernetes_endpoints", svc.Labels, nil)
	metaLabels(base, "__meta_kubernetes_pod", podLabels, pod.Template.Annotations)
	var out []map[string]string
	for _, sp := range svc.Spec.Ports {
		c, cp, ok := containerPort(pod.Template.Spec, sp)
		if !ok {
			return nil, fmt.Errorf("Service %s port %s (targetPort %s): no container of pod %s exposes it", svc.Name, sp.Name, sp.TargetPort.String(), pod.Name)
		}
		t := maps.Clone(base)
		t["__meta_kubernetes_endpoint_port_name"] = sp.Name
		t["__meta_kubernetes_endpoint_port_protocol"] = protocol(sp.Protocol)
		t["__meta_kubernetes_pod_container_name"] = c.Name
		t["__meta_kubernetes_pod_container_image"] = c.Image
		t["__meta_kubernetes_pod_container_port_name"] = cp.Name
		t["__meta_kubernetes_pod_container_port_number"] = strconv.Itoa(int(cp.ContainerPort))
		t["__meta_kubernetes_pod_container_port_protocol"] = protocol(cp.Protocol)
		t["__address__"] = address[sp.Name]
		if t["__address__"] == "" {
			t["__address__"] = pod.IP + ":" + strconv.Itoa(int(cp.ContainerPort))
		}
		out = append(out, t)
	}
	return out, nil
}

// metaLabels adds an object's labels and annotations as service discovery
// names them: prefix_label_<name>, prefix_labelpresent_<name>, and the
// same for annotations.
func metaLabels(into map[string]string, prefix string, labels, annotations map[string]string) {
	for k, v := range labels {
		into[prefix+"_label_"+sanitizeLabel(k)] = v
		into[prefix+"_labelpresent_"+sanitizeLabel(k)] = "true"
	}
	for k, v := range annotations {
		into[prefix+"_annotation_"+sanitizeLabel(k)] = v
		into[prefix+"_annotationpresent_"+sanitizeLabel(k)] = "true"
	}
}

// containerPort finds the container port a Service port's targetPort names
// (by name, by number, or the Service port's own number when unset).
func containerPort(spec corev1.PodSpec, sp corev1.ServicePort) (corev1.Container, corev1.ContainerPort, bool) {
	target := sp.TargetPort
	if target.Type == intstr.Int && target.IntVal == 0 {
		target = intstr.FromInt32(sp.Port)
	}
	for _, c := range spec.Containers {
		for _, cp := range c.Ports {
			if protocol(cp.Protocol) != protocol(sp.Protocol) {
				continue
			}
			if (target.Type == intstr.String && cp.Name == target.StrVal) || (target.Type == intstr.Int && cp.ContainerPort == target.IntVal) {
				return c, cp, true
			}
		}
	}
	return corev1.Container{}, corev1.ContainerPort{}, false
}

func protocol(p corev1.Protocol) string {
	if p == "" {
		return string(corev1.ProtocolTCP)
	}
	return string(p)
}

// PodAt is one pod of a Deployment of a kustomization, placed for a test:
// its name, its IP, and where each Service port it backs is served (the
// Service port's name → host:port of a real process).
type PodAt struct {
	Deployment, Name, IP string
	Addresses            map[string]string
}

// Scrape is one scrape job the Operator would write for a ServiceMonitor
// of a kustomization, with the targets Kubernetes service discovery would
// give it (before the job's relabelings keep or drop them).
type Scrape struct {
	Job     ScrapeJob
	Targets []map[string]string
}

// OperatorScrapes builds the kustomization dir and returns, for each of
// its ServiceMonitors, the Operator's scrape jobs, each with the targets
// of the given pods that a Service it selects (by matchLabels, in its
// namespace) puts behind it. A ServiceMonitor that selects no Service, or
// a pod whose Deployment is not in dir, is an error.
func OperatorScrapes(dir string, pods []PodAt) ([]Scrape, error) {
	objs, err := Build(dir)
	if err != nil {
		return nil, err
	}
	var monitors []*monitoringv1.ServiceMonitor
	var services []*corev1.Service
	deployments := map[string]*appsv1.Deployment{}
	for _, o := range objs {
		switch o.Kind {
		case "ServiceMonitor", "Service", "Deployment":
		default:
			continue
		}
		v, err := Decode(o)
		if err != nil {
			return nil, err
		}
		switch v := v.(type) {
		case *monitoringv1.ServiceMonitor:
			monitors = append(monitors, v)
		case *corev1.Service:
			services = append(services, v)
		case *appsv1.Deployment:
			deployments[v.Name] = v
		}
	}
	var out []Scrape
	for _, sm := range monitors {
		jobs, err := OperatorScrapeJobs(sm, false)
		if err != nil {
			return nil, err
		}
		var targets []map[string]string
		selected := 0
		for _, svc := range services {
			if svc.Namespace != sm.Namespace || !klabels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(klabels.Set(svc.Labels)) {
				continue
			}
			selected++
			for _, p := range pods {
				d, ok := deployments[p.Deployment]
				if !ok {
					return nil, fmt.Errorf("%s: no Deployment %s", dir, p.Deployment)
				}
				if !klabels.SelectorFromSet(svc.Spec.Selector).Matches(klabels.Set(d.Spec.Template.Labels)) {
					continue
				}
				ts, err := EndpointsTargets(svc, Pod{Name: p.Name, Namespace: d.Namespace, IP: p.IP, Node: "node-0", Template: d.Spec.Template,
					ControllerKind: "ReplicaSet", ControllerName: d.Name + "-5d8f7c9b6"}, p.Addresses)
				if err != nil {
					return nil, err
				}
				targets = append(targets, ts...)
			}
		}
		if selected == 0 {
			return nil, fmt.Errorf("%s: ServiceMonitor %s selects no Service", dir, sm.Name)
		}
		for _, j := range jobs {
			out = append(out, Scrape{Job: j, Targets: targets})
		}
	}
	return out, nil
}
