package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/pickapi"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// nginxBinary finds the nginx that make deps installs.
func nginxBinary(t *testing.T) string {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	t.Fatal("nginx is not installed: make deps installs it")
	return ""
}

// startNginx runs nginx in the foreground as a gateway over upstreams,
// hashing consistently on the x-kvroute-prefix-hash request header, and
// stops it at the end of the test.
func startNginx(t *testing.T, upstreams []string) string {
	t.Helper()
	dir := t.TempDir()
	port := testnet.FreePort(t)
	var servers strings.Builder
	for _, u := range upstreams {
		fmt.Fprintf(&servers, "    server %s;\n", strings.TrimPrefix(u, "http://"))
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream engines {
    hash $http_x_kvroute_prefix_hash consistent;
%[2]s  }
  server {
    listen 127.0.0.1:%[3]d;
    location / {
      proxy_pass http://engines;
      proxy_buffering off;
      add_header X-Upstream $upstream_addr always;
    }
  }
}
`, dir, servers.String(), port)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nginxBinary(t), "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"))
	startProcess(t, cmd, syscall.SIGQUIT, func(out string) {
		log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		t.Logf("nginx output:\n%s\n%s", out, log)
	})
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return fmt.Errorf("nginx never answered: %w", err) // startProcess logs its output
		}
		resp.Body.Close()
		return nil
	})
	return url
}

// TestNginxKeyedOnPrefixHash: a gateway that dispatches requests itself
// asks the picker's decision API for the prefix hash and keys nginx's
// consistent hashing on it; every turn of a conversation then lands on
// one upstream, and the engine reports the earlier turns cached.
func TestNginxKeyedOnPrefixHash(t *testing.T) {
	cfg := picker.DefaultServerConfig()
	cfg.AdminListen = "127.0.0.1:0"
	cfg.Listen, cfg.GRPCListen, cfg.Capacity = "127.0.0.1:0", "", 4096
	var engines []string
	for i := 0; i < 3; i++ {
		p := testpod.Start(t, testpod.Options{GPUBlocks: 1024})
		cfg.Sidecars = append(cfg.Sidecars, p.Sidecar.GRPCAddr())
		engines = append(engines, p.Engine.URL())
	}
	pk, err := picker.Start(context.Background(), cfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pk.Close)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := len(pk.View().Endpoints()); n < 3 {
			return fmt.Errorf("the picker never found the endpoints: %d endpoints known", n)
		}
		return nil
	})
	gateway := startNginx(t, engines)
	system := strings.Repeat("You are the support agent of a large shop; follow the policies below. ", 30)
	conversation := []string{"Where is my order 55?"}
	var upstream string
	for turn := 0; turn < 4; turn++ {
		msgs := []map[string]string{{"role": "system", "content": system}}
		for i, m := range conversation {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, map[string]string{"role": role, "content": m})
		}
		body, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "messages": msgs, "max_tokens": 8, "cache_salt": "shop-1"})
		// 1. Ask the picker for the hash.
		resp, err := http.Post("http://"+pk.Addr()+pickapi.Path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var pick pickapi.Answer
		if err := json.NewDecoder(resp.Body).Decode(&pick); err != nil || resp.StatusCode != 200 || len(pick.PrefixHash) != 16 {
			t.Fatalf("turn %d pick: %d %v %+v", turn, resp.StatusCode, err, pick)
		}
		resp.Body.Close()
		// 2. Send the request through nginx, keyed on it.
		req, _ := http.NewRequest(http.MethodPost, gateway+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-KVRoute-Prefix-Hash", pick.PrefixHash)
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		usage := openai.UsageOf(raw)
		if resp.StatusCode != 200 || json.Unmarshal(raw, &out) != nil || len(out.Choices) == 0 || !usage.Seen {
			t.Fatalf("turn %d via nginx: %d %s", turn, resp.StatusCode, raw)
		}
		got := resp.Header.Get("X-Upstream")
		if turn == 0 {
			upstream = got
		} else if got != upstream {
			t.Fatalf("turn %d went to %s, the conversation is on %s", turn, got, upstream)
		} else if usage.Cached < usage.Prompt/2 {
			t.Fatalf("turn %d: %d of %d prompt tokens cached", turn, usage.Cached, usage.Prompt)
		}
		conversation = append(conversation, out.Choices[0].Message.Content, fmt.Sprintf("And question %d?", turn+2))
	}
}
