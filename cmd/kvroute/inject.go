package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/inject"
)

// maxManifest bounds the manifest inject reads.
const maxManifest = 16 << 20

func newInjectCommand() *cobra.Command {
	var file, image string
	var o inject.Options
	cmd := &cobra.Command{
		Use:   "inject -f FILE",
		Short: "Add the kvroute sidecar to the vLLM workloads of a manifest",
		Long: `Read a Kubernetes manifest (FILE, or - for stdin) and write it to stdout with
the kvroute sidecar added to each vLLM workload, the way istioctl kube-inject
adds Envoy. stderr gets one line per object: what was equipped, or why it
passed through.

Workloads: apps/v1 Deployments and StatefulSets (spec.template), and
leaderworkerset.x-k8s.io/v1 LeaderWorkerSets (leaderTemplate, and
workerTemplate, which is also the leader's when there is no leaderTemplate).
Each pod template running a vLLM server gets:

  - the kvroute-sidecar container (the same as deploy/components/sidecar's),
    following the engine's KV events and serving summaries to pickers;
  - on each vLLM server: --kv-events-config (PUB tcp://*:5557, replay
    tcp://*:5657, rank r on +r), --enable-prompt-tokens-details, a fixed
    PYTHONHASHSEED and VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (the Responses
    render endpoint);
  - the pod labels kvroute.io/gossip and kvroute.io/role, and the gossip key
    volume (Secret kvroute-gossip-key; see deploy/README.md).

Every other object — Services, ConfigMaps, Deployments without vLLM, a
LeaderWorkerSet's Ray workers, unknown kinds — is written back byte for
byte, comments and order kept; the items of a List (kubectl get -o yaml) are
objects too. A manifest with nothing to equip is an error.

vLLM containers are those named vllm or vllm-…, running a vllm image, or
running vLLM (--vllm-container names them instead): one, or one per
data-parallel rank (container r: --data-parallel-rank r, --port base+r).
A vLLM server runs from command and args given as lists, or from a shell
script (command: ["/bin/sh", "-c"], args: ["vllm serve …"]; sh or bash)
whose last command is ` + "`vllm serve …`" + ` or
` + "`python3 -m vllm.entrypoints.openai.api_server …`" + ` (after exec or VAR=value at
most; setup commands before it joined by ;, && or newlines): the flags are
added at the end of that command, the rest of the script left as it was. A script whose vLLM command is piped,
backgrounded, redirected, nested (subshell, if, loop, function) or not last
is refused, saying why; so is a --port or other flag inject reads whose
value is only known when the pod starts ($PORT, $(VAR)). Containers running
a Ray worker (multi-node-serving.sh worker, ray start) or vllm serve
--headless serve no API and are left as they are.

Injecting twice changes nothing; the sidecar is rewritten each time, so it
follows edits to the vLLM containers. Contradictions (another
--kv-events-config, several ranks behind one API server, ports colliding
with the sidecar's, a --port other than --engine-port) are errors naming
the object.

  kvroute inject -f vllm.yaml | kubectl apply -f -
  kvroute inject -f llm.yaml --vllm-container engine --engine-port 9000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return usageError(fmt.Errorf("-f FILE is required (- reads stdin)"))
			}
			o.Image = image
			if err := o.Validate(); err != nil {
				return usageError(err)
			}
			var r io.Reader = cmd.InOrStdin()
			if file != "-" {
				f, err := os.Open(file)
				if err != nil {
					return startError(err)
				}
				defer f.Close()
				r = f
			}
			in, err := io.ReadAll(io.LimitReader(r, maxManifest+1))
			if err != nil {
				return startError(err)
			}
			if len(in) > maxManifest {
				return startError(fmt.Errorf("%s: larger than %d MiB", file, maxManifest>>20))
			}
			out, report, err := inject.InjectReport(in, o)
			if err != nil {
				return startError(fmt.Errorf("%s: %w", file, err))
			}
			for _, ob := range report {
				fmt.Fprintln(cmd.ErrOrStderr(), ob)
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "filename", "f", "", "manifest to read (- for stdin)")
	f.IntVar(&o.DataParallelSize, "data-parallel-size", 0, "expected data-parallel ranks per pod, one vLLM container each (default: as many as there are; a mismatch is an error)")
	f.StringVar(&image, "image", "kvroute:"+imageTag(), "the kvroute image")
	f.IntVar(&o.Capacity, "capacity", 65536, "summary capacity in blocks per endpoint: the pickers' --capacity")
	f.StringSliceVar(&o.VLLMContainers, "vllm-container", nil, "the vLLM containers, by name (repeat it, or separate names with commas); in pod order they are the data-parallel ranks (default: containers named vllm or vllm-…, with a vllm image, or running vLLM)")
	f.IntVar(&o.EnginePort, "engine-port", 0, "the port vLLM serves on when its flags give no --port; a --port other than it (rank r: it + r) is an error (default: 8000)")
	return cmd
}

// imageTag is the image tag matching this binary: its version, or latest
// for development builds.
func imageTag() string {
	if version == "dev" || version == "" {
		return "latest"
	}
	return version
}
