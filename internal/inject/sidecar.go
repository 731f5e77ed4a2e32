package inject

import (
	"fmt"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// PreStopSeconds is the vLLM container's preStop sleep: on pod deletion
// the sidecar (which has none) gets SIGTERM at once and tells the pickers
// its engines are draining, while vLLM serves on for this long before its
// own SIGTERM. GraceSeconds is the pod's termination grace period when it
// sets none: the preStop, then the streams in flight.
const (
	PreStopSeconds = 10
	GraceSeconds   = 120
)

// setPreStop gives a vLLM container the preStop sleep, unless it has a
// preStop of its own.
func setPreStop(c *yaml.RNode) error {
	if ps, _ := c.Pipe(yaml.Lookup("lifecycle", "preStop")); ps != nil {
		return nil
	}
	lc, err := c.Pipe(yaml.LookupCreate(yaml.MappingNode, "lifecycle"))
	if err != nil {
		return err
	}
	hook, err := yaml.Parse(fmt.Sprintf("sleep:\n  seconds: %d\n", PreStopSeconds))
	if err != nil {
		return err
	}
	return lc.PipeE(yaml.SetField("preStop", hook))
}

// setEnv adds name=value to the container's env unless name is set.
func setEnv(c *yaml.RNode, name, value string) error {
	env, err := c.Pipe(yaml.LookupCreate(yaml.SequenceNode, "env"))
	if err != nil {
		return err
	}
	elems, err := env.Elements()
	if err != nil {
		return err
	}
	if findByName(elems, name) != nil {
		return nil
	}
	e, err := yaml.Parse(fmt.Sprintf("name: %s\nvalue: %q\n", name, value))
	if err != nil {
		return err
	}
	return env.PipeE(yaml.Append(e.YNode()))
}

// sidecarYAML is the sidecar container (as in the kustomize component, with
// its settings as flags rather than a ConfigMap).
func sidecarYAML(o Options, vllmPort, dp int) string {
	return fmt.Sprintf(`name: %s
image: %s
args:
  - sidecar
  - --engine-url=http://$(POD_IP):%d
  - --kv-events=tcp://127.0.0.1:%d
  - --replay=tcp://127.0.0.1:%d
  - --topic=%s
  - --data-parallel-size=%d
  - --capacity=%d
  - --startup-timeout=30m
  - --grpc-listen=:9090
  - --admin-listen=:8090
  - --gossip-bind=0.0.0.0:7946
  - --gossip-advertise=[$(POD_IP)]:7946
  - --join=%s
  - --gossip-key-file=/etc/kvroute/gossip/keyring
  - --node-name=$(POD_NAME)
env:
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
ports:
  - name: kvr-grpc
    containerPort: 9090
    protocol: TCP
  - name: kvr-admin
    containerPort: 8090
    protocol: TCP
  - name: kvr-gossip-tcp
    containerPort: 7946
    protocol: TCP
  - name: kvr-gossip-udp
    containerPort: 7946
    protocol: UDP
startupProbe:
  httpGet:
    path: /healthz
    port: kvr-admin
  periodSeconds: 10
  failureThreshold: 180
livenessProbe:
  httpGet:
    path: /healthz
    port: kvr-admin
  periodSeconds: 10
  failureThreshold: 3
resources:
  requests:
    cpu: 250m
    memory: 256Mi
  limits:
    memory: 1Gi
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
volumeMounts:
  - name: %s
    mountPath: /etc/kvroute/gossip
    readOnly: true
`, SidecarName, o.Image, vllmPort, KVEventsPort, ReplayPort, Topic, dp, o.Capacity, o.GossipService, gossipKeyVol)
}
