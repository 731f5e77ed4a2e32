package picker_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/picker"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/sidecar"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// tlsPod starts a pod whose sidecar serves TLS from files and requires
// client certificates of the bundle there (--grpc-client-ca); grpcListen
// "" picks a port.
func tlsPod(t *testing.T, files testnet.Files, grpcListen string) *testpod.Pod {
	t.Helper()
	return testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond, Sidecar: func(c *sidecar.Config) {
		c.GRPCTLSCert, c.GRPCTLSKey, c.GRPCClientCA = files.Cert, files.Key, files.CA
		if grpcListen != "" {
			c.GRPCListen = grpcListen
		}
	}})
}

// sidecarSeries reads a series of a pod's sidecar registry.
func sidecarSeries(t *testing.T, pod *testpod.Pod, name string, labels map[string]string) float64 {
	t.Helper()
	v, _ := series(t, pod.Sidecar.Registry(), name, labels)
	return v
}

// streamFailures are the picker's "summary stream failed" lines for the
// sidecar at addr.
func streamFailures(logs *observer.ObservedLogs, addr string) []observer.LoggedEntry {
	return logs.FilterMessage("summary stream failed; retrying").FilterField(zap.String("sidecar", addr)).All()
}

// TestPickerFollowsMutualTLSSidecars: a picker with --sidecar-tls-ca,
// --sidecar-tls-cert and --sidecar-tls-key follows a sidecar requiring
// client certificates (its endpoint routable); a picker with the CA but
// no client certificate, or in plaintext, does not, and says so: the
// sidecar with reason tls (or unavailable) in
// kvroute_picker_sidecar_streams_failing and View.Failing, one log line
// naming the sidecar and the reason over many retries. Rotating the
// picker's client certificate and the sidecar's server certificate
// (same CA, then a CA rotation through bundles holding both) keeps the
// open stream, and a new connection — to a sidecar trusting only the new
// CA — takes the new certificate.
func TestPickerFollowsMutualTLSSidecars(t *testing.T) {
	ca, ca2 := testnet.NewCA(t, "kvroute-ca"), testnet.NewCA(t, "kvroute-ca-2")
	side := testnet.NewFiles(t)
	side.Write(t, ca.Server(t, "sidecar"), ca)
	pod := tlsPod(t, side, "")
	addr := pod.Sidecar.GRPCAddr()
	pick := testnet.NewFiles(t)
	pick.Write(t, ca.Client(t, "picker"), ca)
	later := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)) // a sidecar started at the end
	_, logs, reg := startObserved(t, pod, func(cfg *picker.ServerConfig) {
		cfg.Sidecars = []string{addr, later}
		cfg.SidecarTLSCA, cfg.SidecarTLSCert, cfg.SidecarTLSKey = pick.CA, pick.Cert, pick.Key
	})
	routable := func(n float64) func() error {
		return func() error {
			if got, _ := series(t, reg, "kvroute_picker_endpoint_states", map[string]string{"state": "cached"}); got != n {
				return fmt.Errorf("%v endpoints cached, want %v", got, n)
			}
			return nil
		}
	}
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, routable(1))

	// Without a client certificate, and in plaintext: not followed, and said.
	noCert := testnet.NewFiles(t)
	testnet.WriteFile(t, noCert.CA, testnet.Bundle(ca))
	for _, tc := range []struct {
		name, reason, says string
		adjust             func(*picker.ServerConfig)
	}{
		{"no client certificate", "tls", "requires a client certificate and none is configured",
			func(cfg *picker.ServerConfig) { cfg.SidecarTLSCA = noCert.CA }},
		{"plaintext", "unavailable", "", func(*picker.ServerConfig) {}},
	} {
		before := sidecarSeries(t, pod, "kvroute_sidecar_tls_handshake_failures_total", map[string]string{"server": "grpc"})
		_, plogs, preg := startObserved(t, pod, tc.adjust)
		testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
			if got, _ := series(t, preg, "kvroute_picker_sidecar_streams_failing", map[string]string{"reason": tc.reason}); got != 1 {
				return fmt.Errorf("%s: %v sidecars failing for %s", tc.name, got, tc.reason)
			}
			// Several retries refused by the sidecar, for "once per transition" to mean something.
			if n := sidecarSeries(t, pod, "kvroute_sidecar_tls_handshake_failures_total", map[string]string{"server": "grpc"}); n < before+3 {
				return fmt.Errorf("%s: %v handshakes refused", tc.name, n-before)
			}
			return nil
		})
		if got, _ := series(t, preg, "kvroute_picker_endpoint_states", map[string]string{"state": "cached"}); got != 0 {
			t.Errorf("%s: %v endpoints cached", tc.name, got)
		}
		lines := streamFailures(plogs, addr)
		if len(lines) != 1 || lines[0].ContextMap()["reason"] != tc.reason || !strings.Contains(fmt.Sprint(lines[0].ContextMap()["error"]), tc.says) {
			t.Errorf("%s: the failure lines %v", tc.name, lines)
		}
		if tc.reason == "unavailable" && !strings.Contains(fmt.Sprint(lines[0].ContextMap()["hint"]), "--sidecar-tls-ca") {
			t.Errorf("%s: no hint in %v", tc.name, lines)
		}
	}

	// Rotation with the same CA: the sidecar's server certificate and the
	// picker's client certificate.
	side.Write(t, ca.Server(t, "sidecar"))
	pick.Write(t, ca.Client(t, "picker"))
	// A CA rotation: both bundles trust both CAs, then the picker's
	// certificate moves to the new CA.
	testnet.WriteFile(t, side.CA, testnet.Bundle(ca, ca2))
	testnet.WriteFile(t, pick.CA, testnet.Bundle(ca, ca2))
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		for _, s := range []string{"grpc_tls", "grpc_client_ca"} {
			if n := sidecarSeries(t, pod, "kvroute_sidecar_secret_reloads_total", map[string]string{"secret": s, "result": "ok"}); n != 1 {
				return fmt.Errorf("sidecar %s: %v reloads", s, n)
			}
		}
		for _, s := range []string{"sidecar_tls", "sidecar_ca"} {
			if n, _ := series(t, reg, "kvroute_picker_secret_reloads_total", map[string]string{"secret": s, "result": "ok"}); n != 1 {
				return fmt.Errorf("picker %s: %v reloads", s, n)
			}
		}
		return nil
	})
	pick.Write(t, ca2.Client(t, "picker"))
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		if n, _ := series(t, reg, "kvroute_picker_secret_reloads_total", map[string]string{"secret": "sidecar_tls", "result": "ok"}); n != 2 {
			return fmt.Errorf("picker certificate: %v reloads", n)
		}
		return nil
	})
	// A sidecar trusting only the new CA, with a certificate of it: the
	// picker's new connection must carry the new certificate and trust
	// the new CA.
	side2 := testnet.NewFiles(t)
	side2.Write(t, ca2.Server(t, "sidecar-2"), ca2)
	tlsPod(t, side2, later)
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, routable(2))
	if lines := streamFailures(logs, addr); len(lines) != 0 {
		t.Errorf("the stream opened before the rotations failed: %v", lines)
	}
	if lines := logs.FilterMessage("summary stream recovered").FilterField(zap.String("sidecar", addr)).All(); len(lines) != 0 {
		t.Errorf("the stream opened before the rotations was re-established: %v", lines)
	}
}

// TestPickerServesMutualTLS: --grpc-tls-cert, --grpc-tls-key and
// --grpc-client-ca put the gRPC decision API behind mutual TLS, and
// --ext-proc-client-ca does the same for the endpoint picker: a client
// without a certificate is refused, one with a certificate of the CA is
// answered.
func TestPickerServesMutualTLS(t *testing.T) {
	pod := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond})
	ca := testnet.NewCA(t, "kvroute-ca")
	files := testnet.NewFiles(t)
	files.Write(t, ca.Server(t, "picker"), ca)
	grpcAddr, eppAddr := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	startObserved(t, pod, func(cfg *picker.ServerConfig) {
		cfg.GRPCListen, cfg.ExtProcListen = grpcAddr, eppAddr
		cfg.GRPCTLSCert, cfg.GRPCTLSKey, cfg.GRPCClientCA = files.Cert, files.Key, files.CA
		cfg.ExtProcTLSCert, cfg.ExtProcTLSKey, cfg.ExtProcClientCA = files.Cert, files.Key, files.CA
	})
	client := ca.Client(t, "gateway").TLS(t)
	dial := func(addr string, cert *tls.Certificate) *grpc.ClientConn {
		cfg := &tls.Config{RootCAs: testnet.Pool(ca), MinVersion: tls.VersionTLS12}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	call := func(conn *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := pb.NewPickerClient(conn).Pick(ctx, &pb.PickRequest{Body: []byte(chatBody("s", "hello"))})
		return err
	}
	testnet.Await(t, 15*time.Second, 50*time.Millisecond, func() error { return call(dial(grpcAddr, &client)) })
	if err := call(dial(grpcAddr, nil)); status.Code(err) != codes.Unavailable {
		t.Errorf("the decision API without a client certificate: %v", err)
	}
	health := func(conn *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "liveness"})
		return err
	}
	if err := health(dial(eppAddr, &client)); err != nil {
		t.Errorf("the endpoint picker with a client certificate: %v", err)
	}
	if err := health(dial(eppAddr, nil)); err == nil {
		t.Error("the endpoint picker answered a client without a certificate")
	}
}
