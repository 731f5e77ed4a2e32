package secretfile

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/credentials"
)

// KeyPair is the spec of a certificate chain and its private key, PEM
// files (tls.crt and tls.key of a kubernetes.io/tls Secret): served by a
// server, or presented by a client.
func KeyPair(name, certFlag, certPath, keyFlag, keyPath string) Spec[*tls.Certificate] {
	return Spec[*tls.Certificate]{Name: name, Flags: []string{certFlag, keyFlag}, Paths: []string{certPath, keyPath},
		Parse: func(c [][]byte) (*tls.Certificate, error) {
			if err := onlyBlocks(c[0], "CERTIFICATE"); err != nil {
				return nil, fmt.Errorf("the certificate file: %w", err)
			}
			// tls.X509KeyPair's errors name what is wrong, never the key.
			kp, err := tls.X509KeyPair(c[0], c[1])
			if err != nil {
				return nil, err
			}
			if kp.Leaf == nil {
				if kp.Leaf, err = x509.ParseCertificate(kp.Certificate[0]); err != nil {
					return nil, err
				}
			}
			return &kp, nil
		},
		Describe: func(kp *tls.Certificate) []zap.Field { return describe(kp.Leaf) },
		Expiry:   func(kp *tls.Certificate) time.Time { return kp.Leaf.NotAfter },
	}
}

// Bundle is a CA bundle: the pool verifying peers, and its certificates.
type Bundle struct {
	Pool  *x509.CertPool
	Certs []*x509.Certificate
}

// CABundle is the spec of a CA bundle: a PEM file of one or more
// certificates (ca.crt), which may hold the old CA and the new one while
// a CA rotates. Anything but certificates in it is an error.
func CABundle(name, flag, path string) Spec[*Bundle] {
	return Spec[*Bundle]{Name: name, Flags: []string{flag}, Paths: []string{path},
		Parse: func(c [][]byte) (*Bundle, error) {
			if err := onlyBlocks(c[0], "CERTIFICATE"); err != nil {
				return nil, err
			}
			b := &Bundle{Pool: x509.NewCertPool()}
			for rest := c[0]; ; {
				var blk *pem.Block
				if blk, rest = pem.Decode(rest); blk == nil {
					break
				}
				cert, err := x509.ParseCertificate(blk.Bytes)
				if err != nil {
					return nil, fmt.Errorf("certificate %d: %w", len(b.Certs)+1, err)
				}
				b.Pool.AddCert(cert)
				b.Certs = append(b.Certs, cert)
			}
			return b, nil
		},
		Describe: func(b *Bundle) []zap.Field {
			subjects := make([]string, len(b.Certs))
			for i, c := range b.Certs {
				subjects[i] = c.Subject.String()
			}
			return []zap.Field{zap.Strings("cas", subjects)}
		},
		Expiry: func(b *Bundle) time.Time {
			var first time.Time
			for _, c := range b.Certs {
				if first.IsZero() || c.NotAfter.Before(first) {
					first = c.NotAfter
				}
			}
			return first
		},
	}
}

// onlyBlocks checks b is PEM holding at least one block, every one of
// type want (a key in a certificate file is refused, by its type alone).
func onlyBlocks(b []byte, want string) error {
	n := 0
	for rest := b; ; n++ {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != want {
			return fmt.Errorf("a %s block: want %s blocks only", blk.Type, want)
		}
	}
	if n == 0 {
		return fmt.Errorf("no PEM %s block", want)
	}
	return nil
}

// describe is what a log line says of a certificate.
func describe(c *x509.Certificate) []zap.Field {
	return []zap.Field{zap.String("subject", c.Subject.String()), zap.String("issuer", c.Issuer.String()),
		zap.String("serial", c.SerialNumber.Text(16)), zap.Time("not_after", c.NotAfter)}
}

// ServerTLS is a server's TLS configuration taking its material at each
// handshake: the certificate cert holds then and, with clientCAs, client
// certificates required and verified against the bundle clientCAs holds
// then (nil: none asked for). Connections already open keep theirs.
// Session tickets are off, so every connection is verified against the
// material current at its handshake.
func ServerTLS(cert *File[*tls.Certificate], clientCAs *File[*Bundle]) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, SessionTicketsDisabled: true,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := &tls.Config{MinVersion: tls.VersionTLS12, SessionTicketsDisabled: true, Certificates: []tls.Certificate{*cert.Load()}}
			if clientCAs != nil {
				c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, clientCAs.Load().Pool
			}
			return c, nil
		}}
}

// ServerCredentials are gRPC transport credentials serving ServerTLS(cert,
// clientCAs); each handshake that fails (a client without a certificate,
// one not trusted, a plaintext client) is counted in m's
// kvroute_<subsystem>_tls_handshake_failures_total{server} and logged at
// warn, one line per HandshakeLogEvery at most, with how many failed
// since the last.
func ServerCredentials(server string, cert *File[*tls.Certificate], clientCAs *File[*Bundle], m *Metrics, log *zap.Logger) credentials.TransportCredentials {
	if log == nil {
		log = zap.NewNop()
	}
	if m == nil {
		m = NewMetrics(nil, "")
	}
	return &serverCreds{TransportCredentials: credentials.NewTLS(ServerTLS(cert, clientCAs)), server: server,
		failures: m.handshakes.WithLabelValues(server), log: log}
}

// HandshakeLogEvery bounds the warnings of failed handshakes: a client
// retrying every half second logs one line per interval.
const HandshakeLogEvery = 10 * time.Second

type serverCreds struct {
	credentials.TransportCredentials
	server   string
	failures prometheus.Counter
	log      *zap.Logger

	mu         sync.Mutex
	logged     time.Time
	suppressed int
}

func (c *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.refused(raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (c *serverCreds) refused(remote net.Addr, err error) {
	c.failures.Inc()
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.logged) >= HandshakeLogEvery {
		c.log.Warn("TLS handshake failed: connection refused", zap.String("server", c.server), zap.Stringer("client", remote),
			zap.Error(err), zap.Int("others_since_last_line", c.suppressed))
		c.logged, c.suppressed = now, 0
		return
	}
	c.suppressed++
}

func (c *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: c.TransportCredentials.Clone(), server: c.server, failures: c.failures, log: c.log}
}

// ClientConfig is a client's TLS configuration for one connection to
// serverName, with the material current now: the certificate cert holds
// when the server asks for one, and the server's chain and name verified
// (server-auth usage) against the bundle roots holds now (nil: the
// system's roots), by crypto/tls's standard verification.
//
// A server that asks for a client certificate this client cannot give —
// it has none (cert nil), or the server's acceptable CAs did not sign it —
// would refuse the connection once the handshake is over (TLS 1.3), its
// alert racing a connection reset; the client ends the handshake itself
// instead, with an error saying so. kvroute's servers ask for a
// certificate only when they require one.
func ClientConfig(cert *File[*tls.Certificate], roots *File[*Bundle], serverName string) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	c.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if cert == nil {
			return nil, errors.New("tls: the server requires a client certificate and none is configured")
		}
		kp := cert.Load()
		if err := cri.SupportsCertificate(kp); err != nil {
			return nil, fmt.Errorf("tls: the server does not accept the client certificate (issuer %q): %w", kp.Leaf.Issuer.String(), err)
		}
		return kp, nil
	}
	if roots != nil {
		c.RootCAs = roots.Load().Pool
	}
	return c
}

// ClientCredentials are gRPC transport credentials that build a
// ClientConfig at each handshake, so every new connection takes the
// certificate and the bundle of the moment while open ones keep theirs.
// The server's certificate is verified for serverName, or, when it is
// "", for the host dialled.
func ClientCredentials(cert *File[*tls.Certificate], roots *File[*Bundle], serverName string) credentials.TransportCredentials {
	return &clientCreds{cert: cert, roots: roots, serverName: serverName}
}

type clientCreds struct {
	cert       *File[*tls.Certificate]
	roots      *File[*Bundle]
	serverName string
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.serverName != "" {
		authority = c.serverName // grpc's TLS takes the name to verify from it
	}
	return credentials.NewTLS(ClientConfig(c.cert, c.roots, "")).ClientHandshake(ctx, authority, raw)
}

func (c *clientCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("secretfile: client credentials cannot serve")
}

func (c *clientCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (c *clientCreds) Clone() credentials.TransportCredentials { cp := *c; return &cp }

// OverrideServerName is gRPC's deprecated hook; it sets the name verified.
func (c *clientCreds) OverrideServerName(name string) error { c.serverName = name; return nil }
