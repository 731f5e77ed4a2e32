package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// container returns d's container name.
func container(t *testing.T, d *appsv1.Deployment, name string) corev1.Container {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("%s has no container %s", d.Name, name)
	return corev1.Container{}
}

// mountsSecret checks c mounts d's volume of Secret secret, read-only, at
// path.
func mountsSecret(t *testing.T, d *appsv1.Deployment, c corev1.Container, secret, path string) {
	t.Helper()
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret == nil || v.Secret.SecretName != secret {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name == v.Name && m.MountPath == path && m.ReadOnly {
				return
			}
		}
	}
	t.Errorf("%s/%s does not mount the Secret %s read-only at %s", d.Name, c.Name, secret, path)
}

// flagValue is the value of --name=value in args ("" absent).
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestMTLSComponent: deploy/examples/mtls (examples/vllm with the mtls
// component) builds and decodes strictly; the picker dials the sidecars
// with TLS from the Secret kvroute-picker-tls, and every sidecar serves
// TLS from kvroute-sidecar-tls requiring client certificates — its args
// exactly the sidecar component's plus the three TLS flags, the rest of
// the pod untouched; no Secret is shipped; and the cert-manager example
// issues the two Secrets with the usages and the name the flags expect.
func TestMTLSComponent(t *testing.T) {
	plain, objs := built(t, "examples/vllm"), built(t, "examples/mtls")
	if len(objs) != len(plain) {
		t.Errorf("the component adds or drops objects: %d, then %d", len(plain), len(objs))
	}
	for id := range objs {
		if strings.HasPrefix(id, "Secret/") {
			t.Errorf("%s shipped: it would replace the operator's (or cert-manager's)", id)
		}
	}
	const mount = "/etc/kvroute/tls"
	p := objs["Deployment/kvroute-picker"].(*appsv1.Deployment)
	pc := container(t, p, "picker")
	for flag, file := range map[string]string{"sidecar-tls-ca": "ca.crt", "sidecar-tls-cert": "tls.crt", "sidecar-tls-key": "tls.key"} {
		if got := flagValue(pc.Args, flag); got != mount+"/"+file {
			t.Errorf("picker --%s=%q, want %s/%s", flag, got, mount, file)
		}
	}
	serverName := flagValue(pc.Args, "sidecar-tls-server-name")
	if serverName == "" {
		t.Error("the picker verifies the sidecars for the pod IPs it dials: no --sidecar-tls-server-name")
	}
	mountsSecret(t, p, pc, "kvroute-picker-tls", mount)
	plainPicker := container(t, plain["Deployment/kvroute-picker"].(*appsv1.Deployment), "picker")
	// The bookings streams between pickers: mutual TLS with the same
	// files, verified for the name the certificate carries.
	for flag, file := range map[string]string{"peer-tls-cert": "tls.crt", "peer-tls-key": "tls.key", "peer-tls-ca": "ca.crt"} {
		if got := flagValue(pc.Args, flag); got != mount+"/"+file {
			t.Errorf("picker --%s=%q, want %s/%s", flag, got, mount, file)
		}
	}
	peerName := flagValue(pc.Args, "peer-tls-server-name")
	if peerName == "" {
		t.Error("the pickers verify each other for the pod IPs they dial: no --peer-tls-server-name")
	}
	if !slices.Equal(pc.Args[:len(plainPicker.Args)], plainPicker.Args) || len(pc.Args) != len(plainPicker.Args)+8 {
		t.Errorf("picker args %v: want the base's %v and eight TLS flags", pc.Args, plainPicker.Args)
	}

	v := objs["Deployment/vllm-qwen3"].(*appsv1.Deployment)
	pv := plain["Deployment/vllm-qwen3"].(*appsv1.Deployment)
	sc, psc := container(t, v, "kvroute-sidecar"), container(t, pv, "kvroute-sidecar")
	want := append(slices.Clone(psc.Args), "--grpc-tls-cert="+mount+"/tls.crt", "--grpc-tls-key="+mount+"/tls.key", "--grpc-client-ca="+mount+"/ca.crt")
	if !slices.Equal(sc.Args, want) {
		t.Errorf("sidecar args (components/mtls/sidecar-mtls.yaml restates components/sidecar's: keep them in step)\n got %q\nwant %q", sc.Args, want)
	}
	mountsSecret(t, v, sc, "kvroute-sidecar-tls", mount)
	// Everything else as the sidecar component made it.
	sc.Args, psc.Args = nil, nil
	sc.VolumeMounts = slices.DeleteFunc(slices.Clone(sc.VolumeMounts), func(m corev1.VolumeMount) bool { return m.MountPath == mount })
	if !reflect.DeepEqual(sc, psc) {
		t.Errorf("the sidecar container changed beyond its args and TLS mount:\n%+v\n%+v", sc, psc)
	}
	if !reflect.DeepEqual(container(t, v, "vllm"), container(t, pv, "vllm")) {
		t.Error("the vllm container changed")
	}

	// The cert-manager example: not part of the component, and issuing
	// what it mounts.
	raw, err := os.ReadFile(filepath.Join("components", "mtls", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "resources:") {
		t.Error("the component applies resources: the cert-manager example must stay optional")
	}
	ex, err := os.ReadFile(filepath.Join("components", "mtls", "cert-manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type certificate struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			IsCA       bool     `json:"isCA"`
			SecretName string   `json:"secretName"`
			DNSNames   []string `json:"dnsNames"`
			Usages     []string `json:"usages"`
			IssuerRef  struct {
				Name string `json:"name"`
				Kind string `json:"kind"`
			} `json:"issuerRef"`
			CA *struct {
				SecretName string `json:"secretName"`
			} `json:"ca"`
		} `json:"spec"`
	}
	issuers, certs := map[string]certificate{}, map[string]certificate{}
	for _, doc := range bytes.Split(ex, []byte("\n---\n")) {
		var c certificate
		if err := yaml.Unmarshal(doc, &c); err != nil {
			t.Fatal(err)
		}
		if c.APIVersion != "cert-manager.io/v1" {
			t.Errorf("%s %s: apiVersion %s", c.Kind, c.Metadata.Name, c.APIVersion)
		}
		switch c.Kind {
		case "Issuer":
			issuers[c.Metadata.Name] = c
		case "Certificate":
			certs[c.Spec.SecretName] = c
		default:
			t.Errorf("an unexpected %s", c.Kind)
		}
	}
	for _, c := range certs {
		if _, ok := issuers[c.Spec.IssuerRef.Name]; !ok || c.Spec.IssuerRef.Kind != "Issuer" {
			t.Errorf("%s: issuer %+v not in the example", c.Metadata.Name, c.Spec.IssuerRef)
		}
	}
	if ca := issuers["kvroute-ca"]; ca.Spec.CA == nil || !certs[ca.Spec.CA.SecretName].Spec.IsCA {
		t.Errorf("the CA issuer signs with no CA certificate of the example: %+v", ca)
	}
	side, pick := certs["kvroute-sidecar-tls"], certs["kvroute-picker-tls"]
	if !slices.Contains(side.Spec.Usages, "server auth") || !slices.Contains(side.Spec.DNSNames, serverName) || side.Spec.IssuerRef.Name != "kvroute-ca" {
		t.Errorf("the sidecars' certificate: %+v (want server auth and the name %q)", side.Spec, serverName)
	}
	if !slices.Contains(pick.Spec.Usages, "client auth") || !slices.Contains(pick.Spec.Usages, "server auth") ||
		!slices.Contains(pick.Spec.DNSNames, peerName) || pick.Spec.IssuerRef.Name != "kvroute-ca" {
		t.Errorf("the pickers' certificate: %+v (want client and server auth and the name %q)", pick.Spec, peerName)
	}
}
