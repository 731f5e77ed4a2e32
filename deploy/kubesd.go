package deploy

import (
	"fmt"
	"maps"
	"strconv"

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
