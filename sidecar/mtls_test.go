package sidecar_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/sidecar"
	"github.com/kvroute/kvroute/test/metrictest"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// mtlsPod starts a pod whose sidecar serves the summary stream with the
// server certificate in files and requires client certificates signed by
// a CA of the bundle there; the sidecar's logs are observed.
func mtlsPod(t *testing.T, files testnet.Files) (*testpod.Pod, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	pod := testpod.Start(t, testpod.Options{Scrape: 50 * time.Millisecond, SidecarLog: zap.New(core), Sidecar: func(c *sidecar.Config) {
		c.GRPCTLSCert, c.GRPCTLSKey, c.GRPCClientCA = files.Cert, files.Key, files.CA
	}})
	return pod, logs
}

// dial connects to addr with creds (a new connection each time).
func dial(t *testing.T, addr string, creds credentials.TransportCredentials) pb.SidecarClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewSidecarClient(conn)
}

// clientCreds trusts roots and presents cert (nil: none) whenever the
// server asks, whoever signed it.
func clientCreds(roots *x509.CertPool, cert *tls.Certificate) credentials.TransportCredentials {
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return credentials.NewTLS(cfg)
}

// info asks the sidecar for its endpoints and returns the serial of the
// certificate it served on that connection.
func info(addr string, creds credentials.TransportCredentials) (*big.Int, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := pb.NewSidecarClient(conn).Info(ctx, &pb.InfoRequest{}, grpc.Peer(&p)); err != nil {
		return nil, err
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, fmt.Errorf("no TLS on the connection: %T", p.AuthInfo)
	}
	return ti.State.PeerCertificates[0].SerialNumber, nil
}

// TestClientCertificateRequired: a sidecar started with a client CA
// (--grpc-client-ca) refuses a gRPC client without a client certificate,
// one whose certificate another CA signed, and a plaintext one — each
// refusal counted and logged (at most a line per interval) by the
// sidecar, saying why; a client with a certificate of the CA streams
// summaries.
func TestClientCertificateRequired(t *testing.T) {
	ca, other := testnet.NewCA(t, "kvroute-ca"), testnet.NewCA(t, "other-ca")
	files := testnet.NewFiles(t)
	files.Write(t, ca.Server(t, "sidecar"), ca)
	pod, logs := mtlsPod(t, files)
	addr, roots := pod.Sidecar.GRPCAddr(), testnet.Pool(ca)
	good, stranger := ca.Client(t, "picker").TLS(t), other.Client(t, "picker").TLS(t)

	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
		want  string // the sidecar's reason (with TLS 1.3 the client may see a reset rather than the alert)
	}{
		{"no client certificate", clientCreds(roots, nil), "didn't provide a certificate"},
		{"a client certificate of another CA", clientCreds(roots, &stranger), "unknown authority"},
		{"plaintext", insecure.NewCredentials(), "does not look like a TLS handshake"},
	} {
		before := metrictest.Gathered(t, pod.Sidecar.Registry(), "kvroute_sidecar_tls_handshake_failures_total", map[string]string{"server": "grpc"})
		if _, err := info(addr, tc.creds); err == nil {
			t.Errorf("%s: served", tc.name)
		}
		if got := metrictest.Gathered(t, pod.Sidecar.Registry(), "kvroute_sidecar_tls_handshake_failures_total", map[string]string{"server": "grpc"}); got <= before {
			t.Errorf("%s: the refusal was not counted (%v, then %v)", tc.name, before, got)
		}
		if tc.name == "no client certificate" { // the first refusal is logged at once
			lines := logs.FilterMessage("TLS handshake failed: connection refused").All()
			if len(lines) != 1 || !strings.Contains(fmt.Sprint(lines[0].ContextMap()["error"]), tc.want) {
				t.Errorf("the sidecar's refusal lines: %v", lines)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ws, err := dial(t, addr, tc.creds).WatchSummaries(ctx, &pb.WatchRequest{})
		if err == nil {
			_, err = ws.Recv()
		}
		cancel()
		if err == nil {
			t.Errorf("%s: a summary was streamed", tc.name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := dial(t, addr, clientCreds(roots, &good)).WatchSummaries(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := ws.Recv()
	if err != nil || u.GetEndpoint() != pod.Engine.URL() {
		t.Fatalf("a good client's first update: %v %v", u, err)
	}
}

// TestRotationKeepsTheStream: rotating the sidecar's certificate (the same
// CA, then a new CA, the client CA bundle first holding both) keeps a
// stream opened before alive, while every new connection is served the
// new certificate and verified against the new bundle; a corrupt
// rotation keeps the material in use, warned once and counted.
func TestRotationKeepsTheStream(t *testing.T) {
	ca, ca2 := testnet.NewCA(t, "kvroute-ca"), testnet.NewCA(t, "kvroute-ca-2")
	files := testnet.NewFiles(t)
	first := ca.Server(t, "sidecar")
	files.Write(t, first, ca)
	pod, logs := mtlsPod(t, files)
	addr := pod.Sidecar.GRPCAddr()
	c1 := ca.Client(t, "picker").TLS(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws, err := dial(t, addr, clientCreds(testnet.Pool(ca), &c1)).WatchSummaries(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// alive: the stream opened at the start still delivers (load reports
	// come every scrape).
	alive := func(step string) {
		t.Helper()
		for i := 0; i < 3; i++ {
			if _, err := ws.Recv(); err != nil {
				t.Fatalf("%s: the stream opened before ended: %v", step, err)
			}
		}
	}
	alive("start")
	served := func(step string, creds credentials.TransportCredentials, want *big.Int) {
		t.Helper()
		testnet.Await(t, 10*time.Second, 50*time.Millisecond, func() error {
			got, err := info(addr, creds)
			if err == nil && got.Cmp(want) != 0 {
				err = fmt.Errorf("served serial %x, want %x", got, want)
			}
			return err
		})
		alive(step)
	}
	if got, err := info(addr, clientCreds(testnet.Pool(ca), &c1)); err != nil || got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("the first certificate: %v %v", got, err)
	}

	second := ca.Server(t, "sidecar")
	files.Write(t, second)
	served("the same CA", clientCreds(testnet.Pool(ca), &c1), second.Cert.SerialNumber)

	// A CA rotation: the bundle trusts both, then the certificate moves to
	// the new CA; a client of either CA is served.
	testnet.WriteFile(t, files.CA, testnet.Bundle(ca, ca2))
	c2 := ca2.Client(t, "picker").TLS(t)
	testnet.Await(t, 10*time.Second, 50*time.Millisecond, func() error { _, err := info(addr, clientCreds(testnet.Pool(ca), &c2)); return err })
	third := ca2.Server(t, "sidecar")
	files.Write(t, third)
	served("the new CA", clientCreds(testnet.Pool(ca2), &c2), third.Cert.SerialNumber)
	if _, err := info(addr, clientCreds(testnet.Pool(ca2), &c1)); err != nil {
		t.Fatalf("a client of the old CA while the bundle holds both: %v", err)
	}

	// A corrupt certificate file: the one in use is kept.
	testnet.WriteFile(t, files.Cert, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"))
	testnet.Await(t, 15*time.Second, 50*time.Millisecond, func() error {
		if n := logs.FilterMessageSnippet("cannot be read").FilterField(zap.String("secret", "grpc_tls")).Len(); n != 1 {
			return fmt.Errorf("%d warnings of the broken certificate", n)
		}
		return nil
	})
	if got := metrictest.Gathered(t, pod.Sidecar.Registry(), "kvroute_sidecar_secret_reloads_total", map[string]string{"secret": "grpc_tls", "result": "error"}); got != 1 {
		t.Errorf("%v failed reloads counted, want 1", got)
	}
	if got, err := info(addr, clientCreds(testnet.Pool(ca2), &c2)); err != nil || got.Cmp(third.Cert.SerialNumber) != 0 {
		t.Fatalf("after a corrupt rotation: %v %v, want the certificate in use", got, err)
	}
	alive("a corrupt rotation")
	if got := metrictest.Gathered(t, pod.Sidecar.Registry(), "kvroute_sidecar_secret_reloads_total", map[string]string{"secret": "grpc_tls", "result": "ok"}); got != 2 {
		t.Errorf("%v certificate reloads counted, want 2", got)
	}
	if logs.FilterMessage("secret reloaded").FilterField(zap.String("serial", third.Cert.SerialNumber.Text(16))).Len() != 1 {
		t.Error("no reload line with the new serial")
	}
}
