package e2e

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestGossipOffLoopbackWithoutKeyRefuses: a sidecar or a picker told to
// gossip on an address off loopback with no keyring exits at once with
// an error naming --gossip-key-file and --gossip-insecure, before it binds
// anything (the refusal is the configuration's).
func TestGossipOffLoopbackWithoutKeyRefuses(t *testing.T) {
	bin := buildKvroute(t)
	for _, args := range [][]string{
		{"sidecar", "--gossip-bind", "0.0.0.0:0", "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"},
		{"picker", "--gossip-bind", "0.0.0.0:0", "--join", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--grpc-listen", ""},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		var exit *exec.ExitError
		if err == nil || !errors.As(err, &exit) || timedOut {
			t.Fatalf("%s: %v (it should refuse to start)\n%s", args[0], err, out)
		}
		if s := string(out); !strings.Contains(s, "--gossip-key-file") || !strings.Contains(s, "--gossip-insecure") || !strings.Contains(s, "off loopback") {
			t.Errorf("%s: the refusal does not say what to give:\n%s", args[0], out)
		}
	}
}
