package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/testnet"
)

// TestTLSFlags: the mutual-TLS flags of the picker and the sidecar reach
// their configurations, and every combination that cannot work is a
// usage error naming the flags.
func TestTLSFlags(t *testing.T) {
	base := []string{"--sidecars", "127.0.0.1:9090", "--gossip-bind", ""}
	cmd, cfg, finish := pickerCommand()
	if err := cmd.ParseFlags(append(base, "--sidecar-tls-cert", "c.pem", "--sidecar-tls-key", "k.pem", "--sidecar-tls-ca", "ca.pem",
		"--sidecar-tls-server-name", "kvroute-sidecars", "--grpc-tls-cert", "gc.pem", "--grpc-tls-key", "gk.pem", "--grpc-client-ca", "gca.pem",
		"--ext-proc-listen", ":0", "--ext-proc-tls-cert", "ec.pem", "--ext-proc-tls-key", "ek.pem", "--ext-proc-client-ca", "eca.pem")); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if cfg.SidecarTLSCert != "c.pem" || cfg.SidecarTLSKey != "k.pem" || cfg.SidecarTLSCA != "ca.pem" || cfg.SidecarTLSServerName != "kvroute-sidecars" ||
		cfg.GRPCTLSCert != "gc.pem" || cfg.GRPCTLSKey != "gk.pem" || cfg.GRPCClientCA != "gca.pem" || cfg.ExtProcClientCA != "eca.pem" {
		t.Fatalf("%+v", cfg)
	}
	for _, tc := range []struct{ args, want string }{
		{"--sidecar-tls-ca ca.pem", ""}, // TLS without a client certificate
		{"--sidecar-tls-cert c.pem --sidecar-tls-ca ca.pem", "--sidecar-tls-cert and --sidecar-tls-key go together"},
		{"--sidecar-tls-key k.pem --sidecar-tls-ca ca.pem", "--sidecar-tls-cert and --sidecar-tls-key go together"},
		{"--sidecar-tls-cert c.pem --sidecar-tls-key k.pem", "--sidecar-tls-cert needs --sidecar-tls-ca"},
		{"--sidecar-tls-server-name x", "--sidecar-tls-server-name needs --sidecar-tls-ca"},
		{"--grpc-tls-cert c.pem", "--grpc-tls-cert and --grpc-tls-key go together"},
		{"--grpc-client-ca ca.pem", "--grpc-client-ca needs --grpc-tls-cert"},
		{"--grpc-listen= --grpc-tls-cert c.pem --grpc-tls-key k.pem", "--grpc-tls-cert without --grpc-listen"},
		{"--ext-proc-listen :0 --ext-proc-client-ca ca.pem", "--ext-proc-client-ca needs --ext-proc-tls-cert"},
	} {
		cmd, _, finish := pickerCommand()
		if err := cmd.ParseFlags(append(append([]string{}, base...), strings.Fields(tc.args)...)); err != nil {
			t.Fatal(err)
		}
		err := finish()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("picker %s: %v", tc.args, err)
		}
	}

	scmd, scfg, sfinish := sidecarCommand()
	if err := scmd.ParseFlags([]string{"--grpc-tls-cert", "c.pem", "--grpc-tls-key", "k.pem", "--grpc-client-ca", "ca.pem"}); err != nil {
		t.Fatal(err)
	}
	if err := sfinish(); err != nil || scfg.GRPCClientCA != "ca.pem" {
		t.Fatalf("%v %+v", err, scfg)
	}
	for _, tc := range []struct{ args, want string }{
		{"--grpc-client-ca ca.pem", "--grpc-client-ca needs --grpc-tls-cert and --grpc-tls-key"},
		{"--grpc-tls-key k.pem --grpc-client-ca ca.pem", "--grpc-tls-cert and --grpc-tls-key go together"},
		{"--gossip-bind= --grpc-listen= --grpc-tls-cert c.pem --grpc-tls-key k.pem", "--grpc-tls-cert without --grpc-listen"},
	} {
		cmd, _, finish := sidecarCommand()
		if err := cmd.ParseFlags(strings.Fields(tc.args)); err != nil {
			t.Fatal(err)
		}
		if err := finish(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("sidecar %s: %v", tc.args, err)
		}
	}
}

// TestTLSFilesFailFast: a picker or a sidecar given a TLS file it cannot
// use exits at once, 1 (a start failure, not bad usage), naming the flag
// and the file — the sidecar before it waits for its engine.
func TestTLSFilesFailFast(t *testing.T) {
	ca, other := testnet.NewCA(t, "ca"), testnet.NewCA(t, "other")
	good := testnet.NewFiles(t)
	good.Write(t, ca.Server(t, "s"), ca)
	junk := filepath.Join(t.TempDir(), "junk.pem")
	testnet.WriteFile(t, junk, []byte("not PEM"))
	mismatched := filepath.Join(t.TempDir(), "other.key")
	testnet.WriteFile(t, mismatched, other.Server(t, "x").KeyPEM)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	picker := []string{"picker", "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--sidecars", "127.0.0.1:1", "--gossip-bind", "", "--log-level", "error"}
	// An engine that is not there: the sidecar would wait --startup-timeout for it.
	sidecar := []string{"sidecar", "--engine-url", "http://127.0.0.1:1", "--gossip-bind", "", "--grpc-listen", "127.0.0.1:0", "--log-level", "error"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(picker, "--sidecar-tls-ca", junk), "--sidecar-tls-ca " + junk + ": no PEM CERTIFICATE block"},
		{append(picker, "--sidecar-tls-ca", good.CA, "--sidecar-tls-cert", good.Cert, "--sidecar-tls-key", missing), "--sidecar-tls-key: open " + missing},
		{append(picker, "--grpc-tls-cert", good.Cert, "--grpc-tls-key", mismatched), "private key does not match"},
		{append(picker, "--grpc-tls-cert", good.Cert, "--grpc-tls-key", good.Key, "--grpc-client-ca", good.Key), "--grpc-client-ca " + good.Key + ": a PRIVATE KEY block"},
		{append(sidecar, "--grpc-tls-cert", good.Cert, "--grpc-tls-key", good.Key, "--grpc-client-ca", missing), "--grpc-client-ca: open " + missing},
		{append(sidecar, "--grpc-tls-cert", junk, "--grpc-tls-key", good.Key), "--grpc-tls-cert " + junk},
	} {
		type result struct {
			code   int
			stderr string
		}
		done := make(chan result, 1)
		go func() { code, _, stderr := runArgs(tc.args...); done <- result{code, stderr} }()
		select {
		case r := <-done:
			if r.code != exitError || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%v: exit %d, %q; want 1 and %q", tc.args, r.code, r.stderr, tc.want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%v did not fail fast", tc.args)
		}
	}
}
