package deploy

import (
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/picker/trust"
)

// podIP stands for $(POD_IP) when the manifests' addresses are judged.
const podIP = "10.244.1.7"

// dialledAddr is the gRPC address the pickers dial for the sidecar, as
// the sidecar derives and gossips it: --grpc-advertise, else the listen
// address, with the gossip advertise host when listening on every
// interface.
func dialledAddr(side corev1.Container) string {
	if a := flagValue(side.Args, "grpc-advertise"); a != "" {
		return a
	}
	host, port, _ := net.SplitHostPort(flagValue(side.Args, "grpc-listen"))
	if host == "" || host == "0.0.0.0" || host == "::" {
		host, _, _ = net.SplitHostPort(flagValue(side.Args, "gossip-advertise"))
	}
	return net.JoinHostPort(host, port)
}

// TestSidecarsAdvertiseTheirOwnHost: in every example, each sidecar's
// endpoints (rank r at the pod's address, port 8000+r) are on the host the
// pickers dial it at (the pod's address too), so the pickers' trust check
// takes them with its defaults; no picker needs --allow-remote-endpoints.
func TestSidecarsAdvertiseTheirOwnHost(t *testing.T) {
	sidecars := 0
	for _, dir := range kustomizations(t) {
		raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), "kind: Component") || dir == "monitoring" {
			continue
		}
		for id, v := range built(t, dir) {
			switch o := v.(type) {
			case *corev1.ConfigMap:
				if strings.Contains(strings.Join(slices.Collect(maps.Values(o.Data)), " "), "allow-remote-endpoints") {
					t.Errorf("%s: %s widens the trust check", dir, id)
				}
			case *appsv1.Deployment:
				side, engines := podContainers(o)
				for _, c := range o.Spec.Template.Spec.Containers {
					if flagValue(c.Args, "allow-remote-endpoints") != "" {
						t.Errorf("%s: %s: %s widens the trust check", dir, id, c.Name)
					}
				}
				if side == nil {
					continue
				}
				sidecars++
				dialled := strings.ReplaceAll(dialledAddr(*side), "$(POD_IP)", podIP)
				sh, err := trust.SidecarHost(dialled)
				if err != nil {
					t.Fatalf("%s: %s: %v", dir, id, err)
				}
				side0, _ := trust.Literal(sh)
				for r := range engines {
					url, err := offsetRank(strings.ReplaceAll(flagValue(side.Args, "engine-url"), "$(POD_IP)", podIP), r)
					if err != nil {
						t.Fatalf("%s: %s: %v", dir, id, err)
					}
					eh, err := trust.EndpointHost(url)
					if err != nil {
						t.Fatalf("%s: %s: %v", dir, id, err)
					}
					ep, literal := trust.Literal(eh)
					if v := (trust.Policy{}).Judge(side0, ep); !literal || !v.OK || v.By != trust.BySameHost {
						t.Errorf("%s: %s: rank %d's endpoint %s from the sidecar dialled at %s: %+v", dir, id, r, url, dialled, v)
					}
				}
			}
		}
	}
	if sidecars < 4 {
		t.Fatalf("%d Deployments with the sidecar checked", sidecars)
	}
}

// offsetRank is rank r's engine URL: rank 0's port + r.
func offsetRank(url string, r int) (string, error) {
	i := strings.LastIndex(url, ":")
	port, err := strconv.Atoi(url[i+1:])
	if err != nil {
		return "", err
	}
	return url[:i+1] + strconv.Itoa(port+r), nil
}
