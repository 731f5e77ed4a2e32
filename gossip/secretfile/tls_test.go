package secretfile_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/gossip/secretfile"
	"github.com/kvroute/kvroute/test/testnet"
)

// echoServer serves cfg on 127.0.0.1, echoing what each connection sends.
func echoServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip dials addr, checks an echo, and returns the connection (open)
// or the first error: with TLS 1.3 a refused client certificate shows on
// the first read.
func roundTrip(addr string, cfg *tls.Config) (*tls.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	if err := echo(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func echo(c *tls.Conn) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "ping" {
		return errors.New("no echo")
	}
	return nil
}

func serial(c *tls.Conn) *big.Int { return c.ConnectionState().PeerCertificates[0].SerialNumber }

// TestMutualTLS: a server with a client CA bundle refuses a client
// without a certificate and one whose certificate another CA signed, and
// serves one with a good certificate; a client verifies the server
// against its bundle and the name.
func TestMutualTLS(t *testing.T) {
	ca, other := testnet.NewCA(t, "ca"), testnet.NewCA(t, "other")
	sf, cf := testnet.NewFiles(t), testnet.NewFiles(t)
	sf.Write(t, ca.Server(t, "sidecar", "kvroute-sidecars"), ca)
	cf.Write(t, ca.Client(t, "picker"), ca)
	srvPair, srvCAs := openPair(t, sf, nil, nil), openBundle(t, sf.CA)
	addr := echoServer(t, secretfile.ServerTLS(srvPair, srvCAs))
	cliPair, cliCAs := openPair(t, cf, nil, nil), openBundle(t, cf.CA)

	if _, err := roundTrip(addr, secretfile.ClientConfig(nil, cliCAs, "127.0.0.1")); err == nil || !strings.Contains(err.Error(), "requires a client certificate and none is configured") {
		t.Errorf("no client certificate: %v", err)
	}
	strangerFiles := testnet.NewFiles(t)
	strangerFiles.Write(t, other.Client(t, "stranger"), ca)
	if _, err := roundTrip(addr, secretfile.ClientConfig(openPair(t, strangerFiles, nil, nil), cliCAs, "127.0.0.1")); err == nil || !strings.Contains(err.Error(), "not signed by an acceptable CA") {
		t.Errorf("a client certificate of another CA: %v", err)
	}
	c, err := roundTrip(addr, secretfile.ClientConfig(cliPair, cliCAs, "127.0.0.1"))
	if err != nil {
		t.Fatalf("a good client: %v", err)
	}
	c.Close()
	if c, err := roundTrip(addr, secretfile.ClientConfig(cliPair, cliCAs, "kvroute-sidecars")); err != nil {
		t.Errorf("a fixed server name in the certificate: %v", err)
	} else {
		c.Close()
	}
	if _, err := roundTrip(addr, secretfile.ClientConfig(cliPair, cliCAs, "elsewhere")); err == nil || !strings.Contains(err.Error(), "elsewhere") {
		t.Errorf("a server name not in the certificate: %v", err)
	}
	otherFiles := testnet.NewFiles(t)
	otherFiles.Write(t, other.Client(t, "x"), other)
	if _, err := roundTrip(addr, secretfile.ClientConfig(cliPair, openBundle(t, otherFiles.CA), "127.0.0.1")); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("a server of a CA not trusted: %v", err)
	}
	// A client certificate is no server certificate: a server presenting
	// one (client-auth usage only) is refused.
	badSrv := testnet.NewFiles(t)
	badSrv.Write(t, ca.Client(t, "not-a-server"), ca)
	bad := echoServer(t, secretfile.ServerTLS(openPair(t, badSrv, nil, nil), nil))
	if _, err := roundTrip(bad, secretfile.ClientConfig(nil, cliCAs, "127.0.0.1")); err == nil {
		t.Error("a server presenting a client certificate was accepted")
	}
}

func openBundle(t *testing.T, path string) *secretfile.File[*secretfile.Bundle] {
	t.Helper()
	b, err := secretfile.Open(secretfile.CABundle("ca", "--ca", path), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRotationKeepsConnections: rotating the server's and the client's
// certificates (same CA), then both bundles to one of two CAs and the
// certificates to the new CA's, leaves a connection opened before
// working, while each new connection carries the new certificates.
func TestRotationKeepsConnections(t *testing.T) {
	ca, ca2 := testnet.NewCA(t, "ca"), testnet.NewCA(t, "ca2")
	sf, cf := testnet.NewFiles(t), testnet.NewFiles(t)
	s1, c1 := ca.Server(t, "s1"), ca.Client(t, "c1")
	sf.Write(t, s1, ca)
	cf.Write(t, c1, ca)
	srvPair, srvCAs := openPair(t, sf, nil, nil), openBundle(t, sf.CA)
	cliPair, cliCAs := openPair(t, cf, nil, nil), openBundle(t, cf.CA)
	var mu sync.Mutex // the server's handshakes record the client's serials
	var clientSerials []*big.Int
	srvCfg := secretfile.ServerTLS(srvPair, srvCAs)
	inner := srvCfg.GetConfigForClient
	srvCfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := inner(h)
		if err == nil {
			c.VerifyConnection = func(cs tls.ConnectionState) error {
				mu.Lock()
				defer mu.Unlock()
				clientSerials = append(clientSerials, cs.PeerCertificates[0].SerialNumber)
				return nil
			}
		}
		return c, err
	}
	addr := echoServer(t, srvCfg)
	cli := func() *tls.Config { return secretfile.ClientConfig(cliPair, cliCAs, "127.0.0.1") }
	open, err := roundTrip(addr, cli())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	check := func(step string, server, client *x509.Certificate) {
		t.Helper()
		c, err := roundTrip(addr, cli())
		if err != nil {
			t.Fatalf("%s: a new connection: %v", step, err)
		}
		defer c.Close()
		if serial(c).Cmp(server.SerialNumber) != 0 {
			t.Errorf("%s: served serial %x, want %x", step, serial(c), server.SerialNumber)
		}
		mu.Lock()
		got := clientSerials[len(clientSerials)-1]
		mu.Unlock()
		if got.Cmp(client.SerialNumber) != 0 {
			t.Errorf("%s: client serial %x, want %x", step, got, client.SerialNumber)
		}
		if err := echo(open); err != nil {
			t.Fatalf("%s: the connection opened before: %v", step, err)
		}
	}
	check("start", s1.Cert, c1.Cert)

	s2, c2 := ca.Server(t, "s2"), ca.Client(t, "c2")
	sf.Write(t, s2)
	cf.Write(t, c2)
	srvPair.Check()
	cliPair.Check()
	check("same CA", s2.Cert, c2.Cert)

	// A CA rotation: both bundles trust both CAs first, then the
	// certificates move to the new CA.
	testnet.WriteFile(t, sf.CA, testnet.Bundle(ca, ca2))
	testnet.WriteFile(t, cf.CA, testnet.Bundle(ca, ca2))
	srvCAs.Check()
	cliCAs.Check()
	s3, c3 := ca2.Server(t, "s3"), ca2.Client(t, "c3")
	sf.Write(t, s3)
	cf.Write(t, c3)
	srvPair.Check()
	cliPair.Check()
	check("new CA", s3.Cert, c3.Cert)
	// Then the old CA goes: a client still holding its certificate is
	// refused on a new connection.
	testnet.WriteFile(t, sf.CA, testnet.Bundle(ca2))
	srvCAs.Check()
	oldFiles := testnet.NewFiles(t)
	oldFiles.Write(t, c1)
	if _, err := roundTrip(addr, secretfile.ClientConfig(openPair(t, oldFiles, nil, nil), cliCAs, "127.0.0.1")); err == nil {
		t.Error("a client certificate of the retired CA was accepted")
	}
	if err := echo(open); err != nil {
		t.Fatalf("the connection opened before: %v", err)
	}
}
