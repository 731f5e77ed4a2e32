package deploy

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// TestGatewayExamples checks the gateway component through the examples
// that use it, one rank per pod and two: the pool selects exactly the pods
// with the sidecar and lists each vLLM rank's port; its endpoint picker is
// the picker's ext_proc Service port, which reaches the picker's
// --ext-proc-listen port; the NetworkPolicy opens that port to the
// namespace of the route's Gateway; the route's backend is the pool.
func TestGatewayExamples(t *testing.T) {
	for dir, ranks := range map[string]int{"examples/gateway": 1, "examples/gateway-dp2": 2} {
		t.Run(dir, func(t *testing.T) {
			objs := built(t, dir)
			pool := objs["InferencePool/kvroute-engines"].(*inferencev1.InferencePool)
			route := objs["HTTPRoute/kvroute-llm"].(*gatewayv1.HTTPRoute)
			picker := objs["Deployment/kvroute-picker"].(*appsv1.Deployment)
			epp := objs["Service/kvroute-picker-epp"].(*corev1.Service)
			np := objs["NetworkPolicy/kvroute-picker-ext-proc"].(*networkingv1.NetworkPolicy)

			checkPoolEndpoints(t, objs, pool, ranks)
			listen := checkPickerExtProc(t, picker)
			checkEndpointPicker(t, pool, epp, picker, listen)
			gatewayNS := checkRoute(t, route, pool)
			checkExtProcPolicy(t, np, picker, listen, gatewayNS)

			// The clients' Service is left as it was.
			if svc := objs["Service/kvroute-picker"].(*corev1.Service); ports(svc) != "http:8080,grpc:9000" {
				t.Errorf("picker service ports %s", ports(svc))
			}
			for _, ns := range []string{pool.Namespace, route.Namespace, epp.Namespace, np.Namespace, picker.Namespace} {
				if ns != "llm" {
					t.Errorf("namespace %q, want llm", ns)
				}
			}
		})
	}
}

// checkPoolEndpoints: the pool's selector matches every Deployment with
// the sidecar and no other; in each, the targetPorts are the vLLM
// containers' ports in rank order (what the sidecar announces: podIP and
// rank r's port), as many as the sidecar's data-parallel size.
func checkPoolEndpoints(t *testing.T, objs map[string]any, pool *inferencev1.InferencePool, ranks int) {
	t.Helper()
	var want []int
	for _, p := range pool.Spec.TargetPorts {
		want = append(want, int(p.Number))
	}
	if len(want) != ranks || len(want) > 8 || len(slices.Compact(slices.Sorted(slices.Values(want)))) != len(want) {
		t.Fatalf("targetPorts %v: want %d distinct ports (at most 8)", want, ranks)
	}
	if pool.Spec.AppProtocol != "" && pool.Spec.AppProtocol != inferencev1.AppProtocolHTTP {
		t.Errorf("appProtocol %q: vLLM serves HTTP/1.1", pool.Spec.AppProtocol)
	}
	selected := 0
	for id, v := range objs {
		d, ok := v.(*appsv1.Deployment)
		if !ok {
			continue
		}
		side, engines := podContainers(d)
		in := poolSelects(pool, d.Spec.Template.Labels)
		if in != (side != nil) {
			t.Errorf("%s: selected by the pool %v, has the sidecar %v", id, in, side != nil)
		}
		if !in || side == nil {
			continue
		}
		selected++
		var got []int
		for _, c := range engines {
			got = append(got, vllmPort(c))
			if len(c.Ports) > 0 && !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return int(p.ContainerPort) == vllmPort(c) }) {
				t.Errorf("%s: container %s serves on %d but declares %v", id, c.Name, vllmPort(c), c.Ports)
			}
		}
		if !slices.Equal(got, want) || sidecarDP(t, objs, *side) != len(want) {
			t.Errorf("%s: vLLM ports %v (sidecar: %d ranks), pool targetPorts %v", id, got, sidecarDP(t, objs, *side), want)
		}
		if !slices.Contains(side.Args, "--engine-url=http://$(POD_IP):"+strconv.Itoa(want[0])) {
			t.Errorf("%s: the sidecar does not announce rank 0 at podIP:%d: %v", id, want[0], side.Args)
		}
	}
	if selected == 0 {
		t.Fatal("the pool selects no vLLM Deployment")
	}
}

// checkPickerExtProc: the picker container serves ext_proc, on a declared
// container port; it returns that port.
func checkPickerExtProc(t *testing.T, picker *appsv1.Deployment) corev1.ContainerPort {
	t.Helper()
	c := picker.Spec.Template.Spec.Containers[0]
	var listen string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--ext-proc-listen="); ok {
			listen = v
		}
	}
	if listen != ":9002" {
		t.Fatalf("picker --ext-proc-listen %q, want :9002: %v", listen, c.Args)
	}
	i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "grpc-ext-proc" })
	if i < 0 || ":"+strconv.Itoa(int(c.Ports[i].ContainerPort)) != listen || c.Ports[i].Protocol != corev1.ProtocolTCP {
		t.Fatalf("picker ports %+v: no TCP grpc-ext-proc on %s", c.Ports, listen)
	}
	return c.Ports[i]
}

// checkEndpointPicker: the pool's endpointPickerRef is the EPP Service and
// its ext_proc Service port, which selects the pickers (and only them) and
// targets their ext_proc container port, declared as HTTP/2.
func checkEndpointPicker(t *testing.T, pool *inferencev1.InferencePool, epp *corev1.Service, picker *appsv1.Deployment, listen corev1.ContainerPort) {
	t.Helper()
	ref := pool.Spec.EndpointPickerRef
	if ref == nil || (ref.Group != nil && *ref.Group != "") || (ref.Kind != "" && ref.Kind != "Service") || string(ref.Name) != epp.Name || ref.Port == nil {
		t.Fatalf("endpointPickerRef %+v: want Service %s with a port", ref, epp.Name)
	}
	if ref.FailureMode != inferencev1.EndpointPickerFailClose {
		t.Errorf("failureMode %q", ref.FailureMode)
	}
	i := slices.IndexFunc(epp.Spec.Ports, func(p corev1.ServicePort) bool { return int(p.Port) == int(ref.Port.Number) })
	if i < 0 {
		t.Fatalf("endpointPickerRef port %d is not a port of Service %s (%s)", ref.Port.Number, epp.Name, ports(epp))
	}
	sp := epp.Spec.Ports[i]
	if sp.TargetPort.String() != listen.Name && sp.TargetPort.IntValue() != int(listen.ContainerPort) {
		t.Errorf("Service port %s targets %s, the picker serves ext_proc on %s/%d", sp.Name, sp.TargetPort.String(), listen.Name, listen.ContainerPort)
	}
	if sp.Name != "grpc-ext-proc" || sp.Protocol != corev1.ProtocolTCP || sp.AppProtocol == nil || *sp.AppProtocol != "http2" {
		t.Errorf("Service port %+v: want grpc-ext-proc, TCP, appProtocol http2", sp)
	}
	if len(epp.Spec.Selector) == 0 || !subset(epp.Spec.Selector, picker.Spec.Template.Labels) || poolSelects(pool, epp.Spec.Selector) {
		t.Errorf("Service %s selector %v: picker pods %v", epp.Name, epp.Spec.Selector, picker.Spec.Template.Labels)
	}
	if epp.Labels["app.kubernetes.io/name"] == "kvroute-picker" {
		t.Error("the EPP Service would be scraped by the picker's ServiceMonitor, which wants port http")
	}
}

// checkRoute: the route attaches to a Gateway in a named namespace (the
// NetworkPolicy needs it) and sends to the pool, in the route's namespace;
// it returns the Gateway's namespace.
func checkRoute(t *testing.T, route *gatewayv1.HTTPRoute, pool *inferencev1.InferencePool) string {
	t.Helper()
	if len(route.Spec.ParentRefs) != 1 {
		t.Fatalf("parentRefs %+v", route.Spec.ParentRefs)
	}
	parent := route.Spec.ParentRefs[0]
	if (parent.Group != nil && *parent.Group != gatewayv1.GroupName) || (parent.Kind != nil && *parent.Kind != "Gateway") || parent.Namespace == nil || parent.Name == "" {
		t.Fatalf("parentRef %+v: want a Gateway with a namespace", parent)
	}
	var refs []gatewayv1.HTTPBackendRef
	for _, r := range route.Spec.Rules {
		refs = append(refs, r.BackendRefs...)
	}
	if len(refs) != 1 {
		t.Fatalf("backendRefs %+v", refs)
	}
	b := refs[0].BackendObjectReference
	if b.Group == nil || string(*b.Group) != inferencev1.GroupName || b.Kind == nil || *b.Kind != "InferencePool" || string(b.Name) != pool.Name {
		t.Errorf("backendRef %+v: want InferencePool %s", b, pool.Name)
	}
	if (b.Namespace != nil && string(*b.Namespace) != pool.Namespace) || route.Namespace != pool.Namespace {
		t.Errorf("backendRef namespace %v, route in %s, pool in %s", b.Namespace, route.Namespace, pool.Namespace)
	}
	if b.Port != nil {
		t.Errorf("backendRef port %d: the pool's targetPorts decide", *b.Port)
	}
	return string(*parent.Namespace)
}

// checkExtProcPolicy: the policy admits the ext_proc port on the picker
// pods from the Gateway's namespace, and from nowhere else.
func checkExtProcPolicy(t *testing.T, np *networkingv1.NetworkPolicy, picker *appsv1.Deployment, listen corev1.ContainerPort, gatewayNS string) {
	t.Helper()
	if !subset(np.Spec.PodSelector.MatchLabels, picker.Spec.Template.Labels) || len(np.Spec.PodSelector.MatchLabels) == 0 {
		t.Errorf("policy pod selector %v, picker pods %v", np.Spec.PodSelector.MatchLabels, picker.Spec.Template.Labels)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || len(np.Spec.Ingress[0].Ports) != 1 {
		t.Fatalf("policy ingress %+v", np.Spec.Ingress)
	}
	from, port := np.Spec.Ingress[0].From[0], np.Spec.Ingress[0].Ports[0]
	if from.PodSelector != nil || from.IPBlock != nil || from.NamespaceSelector == nil ||
		!maps.Equal(from.NamespaceSelector.MatchLabels, map[string]string{"kubernetes.io/metadata.name": gatewayNS}) {
		t.Errorf("policy from %+v: want namespace %s", from, gatewayNS)
	}
	if port.Port == nil || port.Port.IntValue() != int(listen.ContainerPort) || port.Protocol == nil || *port.Protocol != corev1.ProtocolTCP || port.EndPort != nil {
		t.Errorf("policy port %+v, ext_proc on %d", port, listen.ContainerPort)
	}
}

// poolSelects reports whether the pool's selector matches labels.
func poolSelects(pool *inferencev1.InferencePool, labels map[string]string) bool {
	sel := map[string]string{}
	for k, v := range pool.Spec.Selector.MatchLabels {
		sel[string(k)] = string(v)
	}
	return len(sel) > 0 && subset(sel, labels)
}

// subset reports whether every label of sel is in labels.
func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
