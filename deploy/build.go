package deploy

import (
	"errors"
	"fmt"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Object is one built manifest.
type Object struct {
	APIVersion, Kind, Name string
	YAML                   []byte
}

// ID names the object as errors do: Kind/name.
func (o Object) ID() string { return o.Kind + "/" + o.Name }

// Build runs kustomize on dir and returns the objects in output order.
func Build(dir string) ([]Object, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []Object
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", r.GetKind(), r.GetName(), err)
		}
		out = append(out, Object{APIVersion: r.GetApiVersion(), Kind: r.GetKind(), Name: r.GetName(), YAML: y})
	}
	return out, nil
}

// newTyped returns a new typed value for apiVersion and kind, or false for
// kinds outside the manifests' set.
func newTyped(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return new(appsv1.Deployment), true
	case "v1 Service":
		return new(corev1.Service), true
	case "v1 ConfigMap":
		return new(corev1.ConfigMap), true
	case "v1 Secret":
		return new(corev1.Secret), true
	case "policy/v1 PodDisruptionBudget":
		return new(policyv1.PodDisruptionBudget), true
	case "networking.k8s.io/v1 NetworkPolicy":
		return new(networkingv1.NetworkPolicy), true
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return new(monitoringv1.ServiceMonitor), true
	case "monitoring.coreos.com/v1 PrometheusRule":
		return new(monitoringv1.PrometheusRule), true
	case "inference.networking.k8s.io/v1 InferencePool":
		return new(inferencev1.InferencePool), true
	case "gateway.networking.k8s.io/v1 HTTPRoute":
		return new(gatewayv1.HTTPRoute), true
	}
	return nil, false
}

// Decode strictly decodes o into its typed form (a pointer to, e.g.,
// appsv1.Deployment); kinds outside the manifests' set are an error.
func Decode(o Object) (any, error) {
	v, ok := newTyped(o.APIVersion, o.Kind)
	if !ok {
		return nil, fmt.Errorf("%s: no type for %s %s", o.ID(), o.APIVersion, o.Kind)
	}
	if err := DecodeInto(o.YAML, v); err != nil {
		return nil, fmt.Errorf("%s: %w", o.ID(), err)
	}
	return v, nil
}

// DecodeInto strictly decodes YAML into v: duplicate keys, unknown or
// miscased fields and values of the wrong type are errors.
func DecodeInto(y []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(y)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}
