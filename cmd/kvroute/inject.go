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
		Short: "Add the kvroute sidecar to a vLLM Deployment manifest",
		Long: `Read Kubernetes Deployment manifests running vLLM (FILE, or - for stdin)
and write them to stdout with the kvroute sidecar added, the way istioctl
kube-inject adds Envoy:

  - the kvroute-sidecar container (the same as deploy/components/sidecar's),
    following the engine's KV events and serving summaries to pickers;
  - on each vLLM container: --kv-events-config (PUB tcp://*:5557, replay
    tcp://*:5657, rank r on +r), --enable-prompt-tokens-details, a fixed
    PYTHONHASHSEED and VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (the Responses
    render endpoint);
  - the pod labels kvroute.io/gossip and kvroute.io/role, and the gossip key
    volume (Secret kvroute-gossip-key; see deploy/README.md).

vLLM containers are those named vllm or vllm-…, running a vllm image, or
running ` + "`vllm serve`" + `: one, or one per data-parallel rank (container r:
--data-parallel-rank r, --port base+r). Injecting twice changes nothing; the
sidecar is rewritten each time, so it follows edits to the vLLM containers.
Objects that are not Deployments, have no vLLM container, serve several
ranks behind one API server, or run vLLM from a shell script are errors
naming the object.

  kvroute inject -f vllm.yaml | kubectl apply -f -`,
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
					return &exitCodeError{code: exitError, err: err}
				}
				defer f.Close()
				r = f
			}
			in, err := io.ReadAll(io.LimitReader(r, maxManifest+1))
			if err != nil {
				return &exitCodeError{code: exitError, err: err}
			}
			if len(in) > maxManifest {
				return &exitCodeError{code: exitError, err: fmt.Errorf("%s: larger than %d MiB", file, maxManifest>>20)}
			}
			out, err := inject.Inject(in, o)
			if err != nil {
				return &exitCodeError{code: exitError, err: fmt.Errorf("%s: %w", file, err)}
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
