package secretfile_test

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/gossip/secretfile"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// counter reads kvroute_test_secret_reloads_total{secret,result} (0 when
// there is no such series).
func counter(t *testing.T, reg *prometheus.Registry, secret, result string) float64 {
	t.Helper()
	return metrictest.Gathered(t, reg, "kvroute_test_secret_reloads_total", map[string]string{"secret": secret, "result": result})
}

func observed() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	return zap.New(core), logs
}

func openPair(t *testing.T, f testnet.Files, m *secretfile.Metrics, log *zap.Logger) *secretfile.File[*tls.Certificate] {
	t.Helper()
	kp, err := secretfile.Open(secretfile.KeyPair("grpc_tls", "--grpc-tls-cert", f.Cert, "--grpc-tls-key", f.Key), m, log)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// TestOpenRefusesBadFiles: every bad file fails Open with the flag and
// the path named and the reason, and no key material in the message.
func TestOpenRefusesBadFiles(t *testing.T) {
	ca, other := testnet.NewCA(t, "ca"), testnet.NewCA(t, "other")
	leaf, stranger := ca.Server(t, "sidecar"), other.Server(t, "x")
	f := testnet.NewFiles(t)
	missing := filepath.Join(t.TempDir(), "absent")
	write := func(path string, b []byte) string { testnet.WriteFile(t, path, b); return path }
	for _, tc := range []struct {
		name, cert, key string
		want            []string
	}{
		{"no cert file", missing, write(f.Key, leaf.KeyPEM), []string{"--grpc-tls-cert", missing, "no such file"}},
		{"no key file", write(f.Cert, leaf.CertPEM), missing, []string{"--grpc-tls-key", missing}},
		{"not PEM", write(f.Cert+".junk", []byte("not a certificate")), f.Key, []string{"--grpc-tls-cert", "no PEM CERTIFICATE block"}},
		{"a key in the cert file", write(f.Cert+".key", leaf.KeyPEM), f.Key, []string{"--grpc-tls-cert", "PRIVATE KEY block"}},
		{"another's key", f.Cert, write(f.Key+".other", stranger.KeyPEM), []string{"--grpc-tls-key", "private key does not match"}},
		{"an empty key", f.Cert, write(f.Key+".empty", nil), []string{"--grpc-tls-key"}},
	} {
		_, err := secretfile.Open(secretfile.KeyPair("grpc_tls", "--grpc-tls-cert", tc.cert, "--grpc-tls-key", tc.key), nil, nil)
		if err == nil {
			t.Errorf("%s: opened", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", tc.name, err, w)
			}
		}
		for _, secret := range [][]byte{leaf.KeyPEM, stranger.KeyPEM} {
			if strings.Contains(err.Error(), strings.Split(string(secret), "\n")[1]) {
				t.Errorf("%s: key material in %q", tc.name, err)
			}
		}
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty bundle", nil, "no PEM CERTIFICATE block"},
		{"a key in the bundle", append(ca.PEM, leaf.KeyPEM...), "PRIVATE KEY block"},
		{"a broken certificate", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), "certificate 1"},
	} {
		_, err := secretfile.Open(secretfile.CABundle("grpc_client_ca", "--grpc-client-ca", write(f.CA, tc.b)), nil, nil)
		if err == nil || !strings.Contains(err.Error(), "--grpc-client-ca "+f.CA) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if _, err := secretfile.Open(secretfile.Secret("salt_key", "--salt-key-file", write(f.Key+".blank", []byte(" \n")), nil, nil), nil, nil); err == nil ||
		!strings.Contains(err.Error(), "--salt-key-file") || !strings.Contains(err.Error(), "empty") {
		t.Errorf("a blank secret: %v", err)
	}
}

// TestReload: a rotated pair is taken by the next check, logged with its
// serial (never its key) and counted; the same bytes again are no reload;
// a bundle of two CAs replaces a bundle of one.
func TestReload(t *testing.T) {
	ca, ca2 := testnet.NewCA(t, "ca"), testnet.NewCA(t, "ca2")
	first, second := ca.Server(t, "s1"), ca.Server(t, "s2")
	f := testnet.NewFiles(t)
	f.Write(t, first, ca)
	reg := prometheus.NewRegistry()
	m := secretfile.NewMetrics(reg, "test")
	log, logs := observed()
	kp := openPair(t, f, m, log)
	bundle, err := secretfile.Open(secretfile.CABundle("ca", "--ca", f.CA), m, log)
	if err != nil {
		t.Fatal(err)
	}
	if kp.Load().Leaf.SerialNumber.Cmp(first.Cert.SerialNumber) != 0 || len(bundle.Load().Certs) != 1 {
		t.Fatal("not the files' material")
	}
	kp.Check()
	if counter(t, reg, "grpc_tls", "ok") != 0 {
		t.Fatal("an unchanged pair reloaded")
	}
	f.Write(t, second, ca, ca2)
	kp.Check()
	bundle.Check()
	if kp.Load().Leaf.SerialNumber.Cmp(second.Cert.SerialNumber) != 0 || len(bundle.Load().Certs) != 2 {
		t.Fatal("the rotation was not taken")
	}
	f.Write(t, second, ca, ca2) // the same bytes, new files
	kp.Check()
	if got := counter(t, reg, "grpc_tls", "ok"); got != 1 {
		t.Errorf("%v reloads counted, want 1", got)
	}
	lines := logs.FilterMessage("secret reloaded").FilterField(zap.String("serial", second.Cert.SerialNumber.Text(16)))
	if lines.Len() != 1 {
		t.Errorf("%d reload lines with the new serial: %v", lines.Len(), logs.All())
	}
	key := strings.Split(string(second.KeyPEM), "\n")[1]
	for _, e := range logs.All() {
		if strings.Contains(e.Message+strings.Join(fieldValues(e), " "), key) {
			t.Errorf("key material in the log: %v", e)
		}
	}
}

func fieldValues(e observer.LoggedEntry) []string {
	var out []string
	for k, v := range e.ContextMap() {
		out = append(out, k, strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(toString(v), "\n", " "), "\t", " ")))
	}
	return out
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if err, ok := v.(error); ok {
		return err.Error()
	}
	return ""
}

// TestCorruptRotationKeepsOld: a rotated file that cannot be used keeps
// the material in use; it is reported once (warned and counted) after
// two checks, not again while it stays, and again after a good rotation
// and a new failure.
func TestCorruptRotationKeepsOld(t *testing.T) {
	ca := testnet.NewCA(t, "ca")
	first, second := ca.Server(t, "s1"), ca.Server(t, "s2")
	f := testnet.NewFiles(t)
	f.Write(t, first, ca)
	reg := prometheus.NewRegistry()
	log, logs := observed()
	kp := openPair(t, f, secretfile.NewMetrics(reg, "test"), log)
	warnings := func() int { return logs.FilterMessageSnippet("cannot be read").Len() }
	testnet.WriteFile(t, f.Cert, []byte("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n"))
	kp.Check()
	if warnings() != 0 || counter(t, reg, "grpc_tls", "error") != 0 {
		t.Fatal("reported on first sight")
	}
	for i := 0; i < 3; i++ {
		kp.Check()
	}
	if warnings() != 1 || counter(t, reg, "grpc_tls", "error") != 1 {
		t.Fatalf("%d warnings, %v errors counted; want 1 and 1", warnings(), counter(t, reg, "grpc_tls", "error"))
	}
	if kp.Load().Leaf.SerialNumber.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatal("the old certificate was not kept")
	}
	if w := logs.FilterMessageSnippet("cannot be read").All()[0]; !strings.Contains(toString(w.ContextMap()["error"]), "--grpc-tls-cert "+f.Cert) {
		t.Errorf("the warning does not name the file: %v", w.ContextMap())
	}
	f.Write(t, second)
	kp.Check()
	if kp.Load().Leaf.SerialNumber.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatal("the good rotation was not taken")
	}
	if err := os.Remove(f.Key); err != nil {
		t.Fatal(err)
	}
	kp.Check()
	kp.Check()
	if warnings() != 2 || counter(t, reg, "grpc_tls", "error") != 2 || kp.Load().Leaf.SerialNumber.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatalf("a missing key: %d warnings, %v errors", warnings(), counter(t, reg, "grpc_tls", "error"))
	}
}

// TestPairWrittenInTwoSteps: a certificate written before its key is not
// reported in between, and the pair is taken once both are there.
func TestPairWrittenInTwoSteps(t *testing.T) {
	ca := testnet.NewCA(t, "ca")
	first, second := ca.Server(t, "s1"), ca.Server(t, "s2")
	f := testnet.NewFiles(t)
	f.Write(t, first, ca)
	log, logs := observed()
	kp := openPair(t, f, nil, log)
	testnet.WriteFile(t, f.Cert, second.CertPEM)
	kp.Check() // the new certificate, the old key
	testnet.WriteFile(t, f.Key, second.KeyPEM)
	kp.Check()
	if logs.FilterLevelExact(zap.WarnLevel).Len() != 0 || kp.Load().Leaf.SerialNumber.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatalf("warnings %v, serial %v", logs.All(), kp.Load().Leaf.SerialNumber)
	}
}

// TestWatchStopsWithItsContext: Watch checks on its interval and returns
// once its context ends.
func TestWatchStopsWithItsContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	testnet.WriteFile(t, path, []byte("one\n"))
	var got []byte
	tok, err := secretfile.Open(secretfile.Secret("token", "--token-file", path, nil, func(b []byte) { got = b }), nil, nil)
	if err != nil || string(tok.Load()) != "one" || string(got) != "one" {
		t.Fatalf("%v %q", err, got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { secretfile.Watch(ctx, 5*time.Millisecond, tok); close(done) }()
	testnet.WriteFile(t, path, []byte("two\n"))
	testnet.Await(t, 5*time.Second, 5*time.Millisecond, func() error {
		if string(tok.Load()) != "two" {
			return errors.New("not reloaded")
		}
		return nil
	})
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not return")
	}
}
