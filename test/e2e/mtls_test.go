package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/kvroute/kvroute/internal/debugapi"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// servedSerial asks the sidecar at addr for its endpoints over a new
// connection (TLS trusting roots, presenting cert when asked; nil: none)
// and returns the serial of the certificate it served.
func servedSerial(addr string, roots *x509.CertPool, cert *tls.Certificate) (*big.Int, error) {
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
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
	return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber, nil
}

// TestMutualTLSProcesses runs the real binaries with mutual TLS on the
// summary streams: a sidecar with --grpc-tls-cert, --grpc-tls-key and
// --grpc-client-ca, found through gossip by a picker with
// --sidecar-tls-ca, --sidecar-tls-cert and --sidecar-tls-key, which
// routes to its endpoint. A gRPC client without a client certificate is
// refused by the sidecar; a picker without one does not follow it, and
// says so on /debug/endpoints (sidecars_failing, reason tls), in
// kvroute_picker_sidecar_streams_failing and in one log line naming the
// sidecar. Rotating the sidecar's certificate and the picker's (same CA,
// then a CA rotation through bundles of both CAs) keeps the picker's
// stream, while new connections get the new certificates; a corrupt
// rotated file keeps the certificate in use, counted.
func TestMutualTLSProcesses(t *testing.T) {
	bin := buildKvroute(t)
	ca, ca2 := testnet.NewCA(t, "kvroute-ca"), testnet.NewCA(t, "kvroute-ca-2")
	side, pick := testnet.NewFiles(t), testnet.NewFiles(t)
	first := ca.Server(t, "kvroute-sidecar")
	side.Write(t, first, ca)
	pick.Write(t, ca.Client(t, "kvroute-picker"), ca)
	f := startHealthFleet(t, bin, 1, nil,
		[]string{"--grpc-tls-cert", side.Cert, "--grpc-tls-key", side.Key, "--grpc-client-ca", side.CA},
		"--sidecar-tls-ca", pick.CA, "--sidecar-tls-cert", pick.Cert, "--sidecar-tls-key", pick.Key)
	dbg, err := debugEndpoints(f.admin)
	if err != nil || len(dbg.Endpoints) != 1 {
		t.Fatalf("%v %+v", err, dbg)
	}
	addr, sidecarAdmin := dbg.Endpoints[0].Sidecar, dbg.Endpoints[0].SidecarDebug
	pickerOut := f.pickerP.Stdout.(*output)
	failures := func(out *output) int {
		n := 0
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.Contains(line, "summary stream failed") && strings.Contains(line, `"sidecar":"`+addr+`"`) {
				n++
			}
		}
		return n
	}

	// A client without a certificate is refused; one with a good one is served.
	if _, err := servedSerial(addr, testnet.Pool(ca), nil); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	good := ca.Client(t, "operator").TLS(t)
	if got, err := servedSerial(addr, testnet.Pool(ca), &good); err != nil || got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("a good client: %v %v", got, err)
	}
	if n := metrictest.Scraped(t, sidecarAdmin+"/metrics", "kvroute_sidecar_tls_handshake_failures_total", map[string]string{"server": "grpc"}); n < 1 {
		t.Errorf("the sidecar counted %v refused handshakes", n)
	}

	// A picker without a client certificate: not followed, and said.
	noCert := testnet.NewFiles(t)
	testnet.WriteFile(t, noCert.CA, testnet.Bundle(ca))
	api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	other := startProcess(t, exec.Command(bin, "picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--gossip-bind", "",
		"--sidecars", addr, "--sidecar-tls-ca", noCert.CA, "--capacity", "4096", "--drain-delay", "0", "--log-level", "info"),
		syscall.SIGTERM, func(out string) { t.Logf("picker without a client certificate:\n%s", out) })
	var failing debugapi.Document
	testnet.Await(t, 20*time.Second, 50*time.Millisecond, func() error {
		var err error
		if failing, err = debugEndpoints("http://" + admin); err != nil {
			return err
		}
		if len(failing.SidecarsFailing) != 1 || failing.SidecarsFailing[0].SecondsFailing < 2 { // a few retries (every 500 ms) in
			return fmt.Errorf("sidecars failing: %+v", failing.SidecarsFailing)
		}
		return nil
	})
	fl := failing.SidecarsFailing[0]
	if fl.Sidecar != addr || fl.Reason != "tls" || !strings.Contains(fl.Error, "requires a client certificate and none is configured") || len(failing.Endpoints) != 0 {
		t.Errorf("/debug/endpoints: %+v", failing)
	}
	if n := metrictest.Scraped(t, "http://"+admin+"/metrics", "kvroute_picker_sidecar_streams_failing", map[string]string{"reason": "tls"}); n != 1 {
		t.Errorf("kvroute_picker_sidecar_streams_failing{reason=tls} %v", n)
	}
	if n := failures(other); n != 1 || !strings.Contains(other.String(), `"reason":"tls"`) {
		t.Errorf("%d failure lines for %s, want 1 with reason tls", n, addr)
	}

	// Rotations: the same CA, then a new CA through bundles of both.
	served := func(step string, cert *tls.Certificate, roots *x509.CertPool, want *big.Int) {
		t.Helper()
		testnet.Await(t, 15*time.Second, 50*time.Millisecond, func() error {
			got, err := servedSerial(addr, roots, cert)
			if err == nil && got.Cmp(want) != 0 {
				err = fmt.Errorf("%s: served %x, want %x", step, got, want)
			}
			return err
		})
	}
	second := ca.Server(t, "kvroute-sidecar")
	side.Write(t, second)
	pick.Write(t, ca.Client(t, "kvroute-picker"))
	served("the same CA", &good, testnet.Pool(ca), second.Cert.SerialNumber)
	testnet.WriteFile(t, side.CA, testnet.Bundle(ca, ca2))
	testnet.WriteFile(t, pick.CA, testnet.Bundle(ca, ca2))
	good2 := ca2.Client(t, "operator").TLS(t)
	testnet.Await(t, 15*time.Second, 50*time.Millisecond, func() error { _, err := servedSerial(addr, testnet.Pool(ca), &good2); return err })
	third := ca2.Server(t, "kvroute-sidecar")
	side.Write(t, third)
	pick.Write(t, ca2.Client(t, "kvroute-picker"))
	served("the new CA", &good2, testnet.Pool(ca2), third.Cert.SerialNumber)
	testnet.Await(t, 15*time.Second, 50*time.Millisecond, func() error {
		if n := f.metric(t, "kvroute_picker_secret_reloads_total", map[string]string{"result": "ok", "secret": "sidecar_tls"}); n != 2 {
			return fmt.Errorf("the picker reloaded its client certificate %v times", n)
		}
		return nil
	})

	// A corrupt certificate: the one in use is kept, and the error counted.
	testnet.WriteFile(t, side.Cert, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"))
	testnet.Await(t, 15*time.Second, 50*time.Millisecond, func() error {
		if n := metrictest.Scraped(t, sidecarAdmin+"/metrics", "kvroute_sidecar_secret_reloads_total", map[string]string{"result": "error", "secret": "grpc_tls"}); n != 1 {
			return fmt.Errorf("%v failed reloads counted", n)
		}
		return nil
	})
	served("a corrupt rotation", &good2, testnet.Pool(ca2), third.Cert.SerialNumber)

	// Through it all the picker's stream stayed up.
	if n := failures(pickerOut); n != 0 {
		t.Errorf("the picker's stream to %s failed %d times", addr, n)
	}
	if states, err := f.states(); err != nil || states[f.urls[0]] != "cached" {
		t.Errorf("states %v %v", states, err)
	}
}
