package picker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/tenant"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// tenantFleet is startFleet with server-side tenant salts on header
// x-tenant, keyed with key.
func tenantFleet(t *testing.T, require bool, key string) *fleet {
	t.Helper()
	cfg := picker.DefaultConfig()
	cfg.TenantHeader, cfg.RequireTenant = "x-tenant", require
	f := startFleet(t, 2, cfg, "")
	s, err := tenant.NewSalter([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	f.router.SetSalter(s)
	return f
}

func as(tenantName string) http.Header { return http.Header{"X-Tenant": {tenantName}} }

// TestTenantSalts: with --tenant-header, two tenants sending the same body
// (the same client salt even) get disjoint keys and different prefix
// hashes; a tenant sending another tenant's derived salt gets its own
// keys still; the body proxied to the engine carries the tenant's salt, so
// the engine caches it under that tenant only; and no salt is needed from
// the client at all.
func TestTenantSalts(t *testing.T) {
	f := tenantFleet(t, false, "0123456789abcdef0123456789abcdef")
	body := chatBody("client-chosen", strings.Repeat("Tell me about tenants. ", 30))
	keysOf := func(h http.Header, body string) pickAnswer {
		t.Helper()
		code, p, raw := f.pick(t, body, h, "?explain=true")
		if code != http.StatusOK || len(p.Keys) == 0 {
			t.Fatalf("%d %s", code, raw)
		}
		return p
	}
	a, b := keysOf(as("acme"), body), keysOf(as("globex"), body)
	if a.PrefixHash == b.PrefixHash {
		t.Fatal("two tenants, one prefix hash")
	}
	for _, k := range a.Keys {
		if slices.Contains(b.Keys, k) {
			t.Fatalf("key %s in both tenants' chains", k)
		}
	}
	if again := keysOf(as("acme"), chatBody("something else", strings.Repeat("Tell me about tenants. ", 30))); !slices.Equal(again.Keys, a.Keys) {
		t.Fatal("a tenant's keys depend on the salt its client sent")
	}
	unsalted := keysOf(nil, body)
	if slices.Equal(unsalted.Keys, a.Keys) || unsalted.PrefixHash == a.PrefixHash {
		t.Fatal("without the header the tenant's keys")
	}
	// Globex sending acme's derived salt still gets globex's keys.
	s, _ := tenant.NewSalter([]byte("0123456789abcdef0123456789abcdef"))
	if stolen := keysOf(as("globex"), chatBody(s.Salt("acme"), strings.Repeat("Tell me about tenants. ", 30))); !slices.Equal(stolen.Keys, b.Keys) {
		t.Fatal("a client-sent salt joined another tenant's chain")
	}

	// Proxied: the engine caches acme's prompt under acme's salt.
	req, _ := http.NewRequest(http.MethodPost, f.api.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("x-tenant", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("proxied: %d %s", resp.StatusCode, raw)
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if p := keysOf(as("acme"), body); p.MatchedBlocks == 0 {
			return errors.New("acme's proxied prompt does not match as acme's: the engine did not get acme's salt")
		}
		return nil
	})
	for name, h := range map[string]http.Header{"globex": as("globex"), "no tenant": nil} {
		if p := keysOf(h, body); p.MatchedBlocks != 0 {
			t.Errorf("%s matches %d blocks of acme's cached prompt", name, p.MatchedBlocks)
		}
	}
}

// TestTenantRequired: with --require-tenant a request without the header
// is refused 401 in OpenAI's format on every route that serves a model,
// a bad or repeated header 400, and the key never shows in an answer.
func TestTenantRequired(t *testing.T) {
	const key = "a-very-secret-salt-key-0123456789"
	f := tenantFleet(t, true, key)
	body := chatBody("", "hello")
	for _, tc := range []struct {
		path   string
		header http.Header
		status int
		code   string
	}{
		{"/routing/v1/pick", nil, 401, "tenant_required"},
		{"/v1/chat/completions", nil, 401, "tenant_required"},
		{"/tokenize", nil, 401, "tenant_required"},
		{"/routing/v1/pick", as(strings.Repeat("x", tenant.MaxTenantBytes+1)), 400, "invalid_tenant"},
		{"/routing/v1/pick", as(""), 400, "invalid_tenant"},
		{"/routing/v1/pick", http.Header{"X-Tenant": {"a", "b"}}, 400, "invalid_tenant"},
		{"/routing/v1/pick", as("acme"), 200, ""},
	} {
		req, _ := http.NewRequest(http.MethodPost, f.api.URL+tc.path, strings.NewReader(body))
		for k, v := range tc.header {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(raw), `"code":"`+tc.code) && tc.code != "" {
			t.Errorf("%s %v: %d %s, want %d %s", tc.path, tc.header, resp.StatusCode, raw, tc.status, tc.code)
		}
		if strings.Contains(string(raw), key) {
			t.Errorf("%s: the salt key in the answer: %s", tc.path, raw)
		}
	}
}

func TestTenantConfig(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.RequireTenant = true
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--require-tenant needs --tenant-header") {
		t.Fatalf("require without header: %v", err)
	}
	cfg.TenantHeader = "bad header"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--tenant-header") {
		t.Fatalf("bad header name: %v", err)
	}
	sc := picker.DefaultServerConfig()
	sc.Sidecars = []string{"127.0.0.1:1"}
	sc.Router.TenantHeader = "x-tenant"
	if err := sc.Validate(); err == nil || !strings.Contains(err.Error(), "--salt-key-file") {
		t.Fatalf("header without key: %v", err)
	}
	sc.SaltKeyFile, sc.ExtProcListen = "k", "127.0.0.1:0"
	if err := sc.Validate(); err != nil { // the endpoint picker sets the salt in the body too
		t.Fatalf("tenant header on the endpoint picker: %v", err)
	}
	sc.ExtProcListen = ""
	sc.Router.TenantHeader, sc.SaltKeyFile = "", "k"
	if err := sc.Validate(); err == nil || !strings.Contains(err.Error(), "without --tenant-header") {
		t.Fatalf("key without header: %v", err)
	}
}

// TestSaltKeyRotation: the picker started with --salt-key-file derives a
// tenant's salt from the file's key; a rotated key file is re-read without
// a restart (the tenant's prefix hash changes), a broken one keeps the key
// loaded before (counted, logged once), and neither key ever appears in
// the logs or the answers.
func TestSaltKeyRotation(t *testing.T) {
	pod := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond})
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "salt.key")
	const key1, key2 = "first-key-0123456789abcdefghij", "second-key-0123456789abcdefghij"
	if err := os.WriteFile(keyFile, []byte(key1+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, logs, reg := startObserved(t, pod, func(cfg *picker.ServerConfig) {
		cfg.Router.TenantHeader, cfg.SaltKeyFile = "x-tenant", keyFile
	})
	body := chatBody("", "hello")
	hash := func() (string, error) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+s.Addr()+"/routing/v1/pick", strings.NewReader(body))
		req.Header.Set("x-tenant", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(raw), key1) || strings.Contains(string(raw), key2) {
			t.Errorf("a salt key in an answer: %s", raw)
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%d %s", resp.StatusCode, raw)
		}
		var a pickAnswer
		return a.PrefixHash, json.Unmarshal(raw, &a)
	}
	var first string
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() (err error) { first, err = hash(); return err })

	if err := os.WriteFile(keyFile, []byte("short\n"), 0o600); err != nil { // broken: kept
		t.Fatal(err)
	}
	testnet.Await(t, 10*time.Second, 50*time.Millisecond, func() error {
		if n := logs.FilterMessageSnippet("cannot be read").Len(); n != 1 {
			return fmt.Errorf("%d warnings of the broken key", n)
		}
		return nil
	})
	if h, err := hash(); err != nil || h != first {
		t.Fatalf("after a broken key: %q %v, want the old key's %q", h, err, first)
	}
	if err := os.WriteFile(keyFile, []byte(key2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, 10*time.Second, 50*time.Millisecond, func() error {
		h, err := hash()
		if err == nil && h == first {
			err = errors.New("the prefix hash is the old key's")
		}
		return err
	})
	if n := logs.FilterMessage("secret reloaded").Len(); n != 1 {
		t.Errorf("%d reload lines, want 1", n)
	}
	for _, e := range logs.All() {
		line := e.Message + fmt.Sprint(e.ContextMap())
		if strings.Contains(line, key1) || strings.Contains(line, key2) {
			t.Errorf("a salt key in the log: %s", line)
		}
	}
	if got, _ := series(t, reg, "kvroute_picker_secret_reloads_total", map[string]string{"secret": "salt_key", "result": "error"}); got != 1 {
		t.Errorf("%v failed reloads counted, want 1", got)
	}
}

// TestTenantGRPC: the gRPC decision API takes the tenant from metadata of
// the header's name: the same prefix hash as over HTTP for that tenant,
// and Unauthenticated without it under --require-tenant.
func TestTenantGRPC(t *testing.T) {
	f := tenantFleet(t, true, "0123456789abcdef0123456789abcdef")
	client := f.grpcClient(t, "")
	body := chatBody("client-chosen", strings.Repeat("Tell me about tenants. ", 30))
	got, err := client.Pick(metadata.AppendToOutgoingContext(context.Background(), "x-tenant", "acme"), &pb.PickRequest{Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	code, want, raw := f.pick(t, body, as("acme"), "")
	if code != http.StatusOK || got.PrefixHash != want.PrefixHash {
		t.Fatalf("gRPC prefix hash %q, HTTP %d %s", got.PrefixHash, code, raw)
	}
	if _, other, _ := f.pick(t, body, as("globex"), ""); other.PrefixHash == got.PrefixHash {
		t.Fatal("another tenant's prefix hash")
	}
	if _, err := client.Pick(context.Background(), &pb.PickRequest{Body: []byte(body)}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no tenant: %v", err)
	}
}
