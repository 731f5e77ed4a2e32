package gossip

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip/secretfile"
	"github.com/kvroute/kvroute/test/testnet"
)

func sidecarMeta(name string, seq uint64) Meta {
	return Meta{Role: RoleSidecar, GRPC: name + ":9090", Group: "g1",
		Endpoints: []Digest{{Endpoint: "http://" + name + ":8000", Epoch: 1, Seq: seq}}}
}

func start(t *testing.T, cfg Config, meta Meta) *Members {
	t.Helper()
	m, err := New(cfg, meta, zap.NewNop(), prometheus.NewRegistry()) // memberlist logs after Shutdown returns
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Kill() })
	return m
}

// waitEvent reads events until one matches.
func waitEvent(t *testing.T, m *Members, d time.Duration, match func(Event) bool) Event {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case ev := <-m.Events():
			if match(ev) {
				return ev
			}
		case <-timeout:
			t.Fatal("timed out waiting for an event")
		}
	}
}

func memberNames(m *Members) string {
	var names []string
	for _, mb := range m.Members() {
		names = append(names, mb.Name)
	}
	return strings.Join(names, ",")
}

// TestMockNetwork: three members on memberlist's in-memory transport see
// each other with metadata, see updates, and see a dead member leave.
func TestMockNetwork(t *testing.T) {
	var net memberlist.MockNetwork
	var ms []*Members
	for i := 0; i < 3; i++ {
		cfg := LocalConfig(fmt.Sprintf("node%d", i))
		cfg.Transport = net.NewTransport(cfg.NodeName)
		if i > 0 {
			cfg.Join = []string{ms[0].LocalAddr()}
		}
		meta := sidecarMeta(cfg.NodeName, 0)
		if i == 2 {
			meta = Meta{Role: RolePicker}
		}
		ms = append(ms, start(t, cfg, meta))
	}
	for _, m := range ms {
		testnet.Await(t, 5*time.Second, 20*time.Millisecond, func() error {
			if got := len(m.Members()); got != 3 {
				return fmt.Errorf("%d members, want 3: %s", got, memberNames(m))
			}
			return nil
		})
	}
	picker := ms[2]
	for _, mb := range picker.Members() {
		if mb.MetaErr != nil {
			t.Fatalf("%s: %v", mb.Name, mb.MetaErr)
		}
		if mb.Name == "node1" && (mb.Meta.GRPC != "node1:9090" || mb.Meta.Endpoints[0].Endpoint != "http://node1:8000") {
			t.Fatalf("meta %+v", mb.Meta)
		}
	}
	if err := ms[1].SetMeta(sidecarMeta("node1", 42)); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, picker, 5*time.Second, func(ev Event) bool {
		return ev.Type == Update && ev.Member.Name == "node1" && ev.Member.Meta.Endpoints[0].Seq == 42
	})
	if ev.Member.Meta.Endpoints[0].Epoch != 1 {
		t.Fatalf("update %+v", ev)
	}
	if err := ms[1].Close(); err != nil { // leaves politely
		t.Fatal(err)
	}
	waitEvent(t, picker, 10*time.Second, func(ev Event) bool { return ev.Type == Leave && ev.Member.Name == "node1" })
	if got := memberNames(picker); strings.Contains(got, "node1") {
		t.Fatalf("departed member still listed: %s", got)
	}
}

// TestFailureDetection: over real UDP/TCP, a member that dies without
// leaving is reported gone within seconds.
func TestFailureDetection(t *testing.T) {
	a := start(t, LocalConfig("alive"), Meta{Role: RolePicker})
	cfg := LocalConfig("doomed")
	cfg.Join = []string{a.LocalAddr()}
	d := start(t, cfg, sidecarMeta("doomed", 0))
	testnet.Await(t, 5*time.Second, 20*time.Millisecond, func() error {
		if got := len(a.Members()); got != 2 {
			return fmt.Errorf("%d members, want 2: %s", got, memberNames(a))
		}
		return nil
	})
	killed := time.Now()
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, a, 15*time.Second, func(ev Event) bool { return ev.Type == Leave && ev.Member.Name == "doomed" })
	t.Logf("failure detected after %v", time.Since(killed).Round(10*time.Millisecond))
}

func writeKeys(t *testing.T, path string, keys ...[]byte) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# gossip keys, primary first\n")
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k) + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRealNetworkEncryptedWithRotation: two members over real UDP/TCP on
// loopback with an encrypted keyring; a member with another key cannot
// join; keys rotate without the members losing each other.
func TestRealNetworkEncryptedWithRotation(t *testing.T) {
	dir := t.TempDir()
	keyA, keyB, keyC := []byte("aaaaaaaaaaaaaaaa"), []byte("bbbbbbbbbbbbbbbb"), []byte("cccccccccccccccc")
	files := []string{filepath.Join(dir, "n0.keys"), filepath.Join(dir, "n1.keys")}
	for _, f := range files {
		writeKeys(t, f, keyA)
	}
	var ms []*Members
	for i, f := range files {
		cfg := LocalConfig(fmt.Sprintf("real%d", i))
		cfg.KeyFile = f
		if i > 0 {
			cfg.Join = []string{ms[0].LocalAddr()}
		}
		ms = append(ms, start(t, cfg, sidecarMeta(cfg.NodeName, 0)))
	}
	for _, m := range ms {
		testnet.Await(t, 5*time.Second, 20*time.Millisecond, func() error {
			if got := len(m.Members()); got != 2 {
				return fmt.Errorf("%d members, want 2: %s", got, memberNames(m))
			}
			return nil
		})
	}
	// Wrong key: the join fails.
	stranger := filepath.Join(dir, "stranger.keys")
	writeKeys(t, stranger, keyC)
	cfg := LocalConfig("stranger")
	cfg.KeyFile = stranger
	s := start(t, cfg, Meta{Role: RolePicker})
	if n, err := s.Join(ms[0].LocalAddr()); err == nil && n > 0 {
		t.Fatal("a member with another key joined")
	}
	// Rotate A → B: add B everywhere, make B primary everywhere, drop A.
	for _, step := range [][][]byte{{keyA, keyB}, {keyB, keyA}, {keyB}} {
		for i, f := range files {
			writeKeys(t, f, step...)
			if err := ms[i].ReloadKeys(); err != nil {
				t.Fatal(err)
			}
		}
		if err := ms[1].SetMeta(sidecarMeta("real1", uint64(len(step)*10))); err != nil {
			t.Fatal(err)
		}
		want := uint64(len(step) * 10)
		testnet.Await(t, 5*time.Second, 20*time.Millisecond, func() error {
			for _, mb := range ms[0].Members() {
				if mb.Name == "real1" && len(mb.Meta.Endpoints) == 1 && mb.Meta.Endpoints[0].Seq == want {
					return nil
				}
			}
			return fmt.Errorf("no meta update to seq %d after a key change: %s", want, memberNames(ms[0]))
		})
	}
	if len(ms[0].keyring.GetKeys()) != 1 {
		t.Fatalf("%d keys left after rotation", len(ms[0].keyring.GetKeys()))
	}
	// Nobody was lost on the way: no Leave during the rotation.
	for {
		select {
		case ev := <-ms[0].Events():
			if ev.Type == Leave {
				t.Fatalf("%s left during key rotation", ev.Member.Name)
			}
			continue
		default:
		}
		break
	}
}

// TestKeyFileChangeAppliedWithoutSignal: a member adopts its key file's
// new keys by itself (no ReloadKeys, no SIGHUP), counted and logged as
// the other secrets' reloads are; a broken file keeps the keys in use
// and is counted as an error.
func TestKeyFileChangeAppliedWithoutSignal(t *testing.T) {
	dir := t.TempDir()
	keyA, keyB := []byte("aaaaaaaaaaaaaaaa"), []byte("bbbbbbbbbbbbbbbb")
	path := filepath.Join(dir, "keys")
	writeKeys(t, path, keyA)
	reg := prometheus.NewRegistry()
	cfg := LocalConfig("rotating")
	cfg.KeyFile, cfg.KeyPoll, cfg.Secrets = path, 20*time.Millisecond, secretfile.NewMetrics(reg, "test")
	m, err := New(cfg, sidecarMeta("rotating", 0), zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Kill() })
	reloads := func(result string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "kvroute_test_secret_reloads_total" {
				continue
			}
			for _, mt := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range mt.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["secret"] == "gossip_key" && labels["result"] == result {
					return mt.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	keysNow := func() string {
		var out []string
		for _, k := range m.keyring.GetKeys() {
			out = append(out, string(k[:1]))
		}
		return "primary " + string(m.keyring.GetPrimaryKey()[:1]) + ", keys " + strings.Join(out, "")
	}
	for i, step := range []struct {
		keys [][]byte
		want string
	}{{[][]byte{keyA, keyB}, "primary a, keys ab"}, {[][]byte{keyB, keyA}, "primary b, keys ba"}, {[][]byte{keyB}, "primary b, keys b"}} {
		writeKeys(t, path, step.keys...)
		testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
			if got := keysNow(); got != step.want {
				return fmt.Errorf("step %d: %s, want %s", i, got, step.want)
			}
			return nil
		})
	}
	if got := reloads("ok"); got != 3 {
		t.Errorf("gossip_key reloads ok: %v, want 3", got)
	}
	// A stranger holding only the new key joins.
	scfg := LocalConfig("stranger")
	scfg.KeyFile = filepath.Join(dir, "stranger.keys")
	writeKeys(t, scfg.KeyFile, keyB)
	s := start(t, scfg, Meta{Role: RolePicker})
	if n, err := s.Join(m.LocalAddr()); err != nil || n != 1 {
		t.Fatalf("a member with the new key did not join: %d, %v", n, err)
	}
	// A broken file: the keys stay, one error counted.
	if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := reloads("error"); got != 1 {
			return fmt.Errorf("gossip_key reloads error: %v, want 1", got)
		}
		return nil
	})
	if got := keysNow(); got != "primary b, keys b" {
		t.Errorf("a broken key file changed the keyring: %s", got)
	}
	if err := m.ReloadKeys(); err == nil || !strings.Contains(err.Error(), "--gossip-key-file") || strings.Contains(err.Error(), "not a key") {
		t.Errorf("ReloadKeys of a broken file: %v (want the flag named, the content not quoted)", err)
	}
}

func TestMetaAndConfig(t *testing.T) {
	m := sidecarMeta("x", 1)
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeMeta(b)
	if err != nil || back.GRPC != m.GRPC || back.Endpoints[0].Seq != 1 {
		t.Fatalf("round trip %+v %v", back, err)
	}
	big := Meta{Role: RoleSidecar}
	for i := 0; i < 20; i++ {
		big.Endpoints = append(big.Endpoints, Digest{Endpoint: fmt.Sprintf("http://a-rather-long-pod-name-%d.svc:8000", i)})
	}
	if _, err := big.Encode(); err == nil {
		t.Fatal("oversized metadata encoded")
	}
	for _, bad := range []string{``, `{}`, `{"r":"boss"}`, `{"r":"sidecar","d":[{}]}`, `{"r":"sidecar"} {"r":"picker"}`, strings.Repeat("x", 600)} {
		if _, err := DecodeMeta([]byte(bad)); err == nil {
			t.Errorf("DecodeMeta(%q) accepted", bad)
		}
	}
	for _, c := range []Config{{}, {NodeName: "n", BindAddr: "nope", EventBuffer: 1}, {NodeName: "n", BindAddr: "127.0.0.1", BindPort: 70000, EventBuffer: 1}} {
		if err := c.Validate(); err == nil {
			t.Errorf("config %+v valid", c)
		}
	}
	dir := t.TempDir()
	for _, content := range []string{"", "not base64!", base64.StdEncoding.EncodeToString([]byte("short"))} {
		f := filepath.Join(dir, "k")
		os.WriteFile(f, []byte(content), 0o600)
		if _, err := secretfile.Open(keyFileSpec(f, nil), nil, nil); err == nil {
			t.Errorf("key file %q accepted", content)
		}
	}
	if got, err := resolve("localhost", 7946); err != nil || len(got) == 0 || !strings.HasSuffix(got[0], ":7946") {
		t.Fatalf("resolve localhost: %v %v", got, err)
	}
}

// TestGossipOffLoopbackNeedsAKey: gossip off loopback without a keyring
// is refused unless Insecure, which then counts as unencrypted (what the
// start-up warning, kvroute_gossip_insecure and /debug/state report).
func TestGossipOffLoopbackNeedsAKey(t *testing.T) {
	for _, tc := range []struct {
		bind, key   string
		insecure    bool
		valid, open bool
	}{
		{"127.0.0.1", "", false, true, false},
		{"::1", "", false, true, false},
		{"0.0.0.0", "", false, false, true},
		{"10.1.2.3", "", false, false, true},
		{"0.0.0.0", "/etc/keyring", false, true, false},
		{"0.0.0.0", "", true, true, true},
	} {
		c := DefaultConfig()
		c.BindAddr, c.KeyFile, c.Insecure = tc.bind, tc.key, tc.insecure
		err := c.Validate()
		if (err == nil) != tc.valid || c.unencryptedOffLoopback() != tc.open {
			t.Errorf("%+v: %v, unencrypted off loopback %v", tc, err, c.unencryptedOffLoopback())
		}
		if err != nil && !strings.Contains(err.Error(), "--gossip-insecure") {
			t.Errorf("%+v: %v does not name --gossip-insecure", tc, err)
		}
	}
	if c := DefaultConfig(); c.BindAddr != "127.0.0.1" {
		t.Errorf("default bind %s, want loopback", c.BindAddr)
	}
}

// TestMetaModels: a sidecar's models round-trip (key m); metadata without
// them (an older sidecar's) still decodes, its models unknown (nil), as
// does metadata with a key this version does not know (a newer
// member's); hostile or oversized model lists are refused on both sides;
// AdvertisedModels gives every name or none.
func TestMetaModels(t *testing.T) {
	m := sidecarMeta("x", 1)
	m.Models = []string{"Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B-Instruct"}
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"m":["Qwen/Qwen3-0.6B","meta-llama/Llama-3.1-8B-Instruct"]`) {
		t.Errorf("wire form %s: want the models under m", b)
	}
	back, err := DecodeMeta(b)
	if err != nil || !slices.Equal(back.Models, m.Models) || back.GRPC != m.GRPC || back.Endpoints[0].Seq != 1 {
		t.Fatalf("round trip %+v %v", back, err)
	}
	// The old form, and a newer member's unknown key.
	for _, ok := range []string{
		`{"r":"sidecar","g":"10.0.0.5:9090","i":"abc","d":[{"e":"http://10.0.0.5:8000","p":1,"s":9}]}`,
		`{"r":"sidecar","g":"10.0.0.5:9090","x":{"future":[1,2]}}`,
		`{"r":"picker","g":"10.0.0.6:9000","m":["a"]}`,
	} {
		got, err := DecodeMeta([]byte(ok))
		if err != nil {
			t.Errorf("DecodeMeta(%s): %v", ok, err)
		}
		if strings.HasPrefix(ok, `{"r":"sidecar"`) && got.Models != nil {
			t.Errorf("DecodeMeta(%s): models %q, want none (unknown)", ok, got.Models)
		}
	}
	tooMany := make([]string, MaxModels+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("m%d", i)
	}
	hostile := [][]string{
		{""},
		{"a", ""},
		{strings.Repeat("x", MaxModelLen+1)},
		{"a\x00b"},
		{"line\nbreak"},
		{"\xff\xfe"},
		{"a", "a"},
		tooMany,
	}
	for _, models := range hostile {
		bad := Meta{Role: RoleSidecar, GRPC: "h:1", Models: models}
		if _, err := bad.Encode(); err == nil {
			t.Errorf("Encode with models %q accepted", models)
		}
		// (JSON cannot carry invalid UTF-8: the decoder reads U+FFFD.)
		wire, _ := json.Marshal(map[string]any{"r": "sidecar", "g": "h:1", "m": models})
		if len(wire) <= MetaLimit && !slices.ContainsFunc(models, func(m string) bool { return !utf8.ValidString(m) }) {
			if _, err := DecodeMeta(wire); err == nil {
				t.Errorf("DecodeMeta(%s) accepted", wire)
			}
		}
		if got := AdvertisedModels(models); got != nil && !slices.Equal(models, []string{"a", "a"}) && !slices.Equal(models, []string{"a", ""}) {
			t.Errorf("AdvertisedModels(%q) = %q, want none", models, got)
		}
	}
	for _, bad := range []string{`{"r":"sidecar","m":"a"}`, `{"r":"sidecar","m":[1]}`, `{"r":"sidecar","m":{"a":1}}`} {
		if _, err := DecodeMeta([]byte(bad)); err == nil {
			t.Errorf("DecodeMeta(%s) accepted", bad)
		}
	}
	// Names that fit each bound but not together: too large, refused as such.
	long := Meta{Role: RoleSidecar, GRPC: "h:1"}
	for i := 0; i < 3; i++ {
		long.Models = append(long.Models, fmt.Sprintf("%d%s", i, strings.Repeat("y", MaxModelLen-1)))
	}
	if _, err := long.Encode(); !errors.Is(err, ErrMetaTooLarge) {
		t.Errorf("three %d-byte names: %v, want ErrMetaTooLarge", MaxModelLen, err)
	}
	// All or none, each once, sorted.
	for _, c := range []struct{ in, want []string }{
		{nil, nil},
		{[]string{"", ""}, nil},
		{[]string{"b", "a", "b", ""}, []string{"a", "b"}},
		{[]string{"a", strings.Repeat("x", MaxModelLen+1)}, nil},
		{[]string{"ok", "bad\tname"}, nil},
		{tooMany, nil},
	} {
		if got := AdvertisedModels(c.in); !slices.Equal(got, c.want) {
			t.Errorf("AdvertisedModels(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
