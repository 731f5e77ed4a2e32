package testnet

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// CA is a certificate authority made for one test: it signs server and
// client certificates for 127.0.0.1 and localhost, valid for an hour.
type CA struct {
	Cert *x509.Certificate
	PEM  []byte // the CA certificate, PEM: a CA bundle of one
	key  *ecdsa.PrivateKey
	dir  string
}

// Leaf is a certificate a CA signed, with its key.
type Leaf struct {
	Cert            *x509.Certificate
	CertPEM, KeyPEM []byte
}

// NewCA makes a CA named name; its files go to a temporary directory of t's.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key, dir: t.TempDir()}
}

// Server signs a server certificate (server auth) for 127.0.0.1,
// localhost and the extra DNS names given.
func (ca *CA) Server(t testing.TB, cn string, dnsNames ...string) Leaf {
	t.Helper()
	return ca.sign(t, cn, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, append([]string{"localhost"}, dnsNames...))
}

// Peer signs a certificate for both ends (server and client auth), for
// 127.0.0.1 and localhost: a process that serves and dials its peers
// with one certificate, as pickers following each other's bookings do.
func (ca *CA) Peer(t testing.TB, cn string) Leaf {
	t.Helper()
	return ca.sign(t, cn, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, []string{"localhost"})
}

// Client signs a client certificate (client auth).
func (ca *CA) Client(t testing.TB, cn string) Leaf {
	t.Helper()
	return ca.sign(t, cn, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil)
}

func (ca *CA) sign(t testing.TB, cn string, usage []x509.ExtKeyUsage, dnsNames []string) Leaf {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage,
	}
	if slices.Contains(usage, x509.ExtKeyUsageServerAuth) {
		tmpl.DNSNames, tmpl.IPAddresses = dnsNames, []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Leaf{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})}
}

// TLS is the leaf as a tls.Certificate, for a test's own client or server.
func (l Leaf) TLS(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Files is where a process reads a certificate, its key and a CA bundle.
type Files struct{ Cert, Key, CA string }

// NewFiles returns paths for a certificate, a key and a CA bundle in a
// new temporary directory of t's (nothing written yet).
func NewFiles(t testing.TB) Files {
	t.Helper()
	dir := t.TempDir()
	return Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), CA: filepath.Join(dir, "ca.crt")}
}

// Write puts leaf and the CA bundle (the CAs' certificates, concatenated;
// none: the bundle is left as it is) in f, each file replaced at once (a
// rename, as the kubelet swaps a Secret's files), the key first.
func (f Files) Write(t testing.TB, leaf Leaf, bundle ...*CA) {
	t.Helper()
	WriteFile(t, f.Key, leaf.KeyPEM)
	WriteFile(t, f.Cert, leaf.CertPEM)
	if len(bundle) > 0 {
		WriteFile(t, f.CA, Bundle(bundle...))
	}
}

// Bundle is the CAs' certificates, concatenated.
func Bundle(cas ...*CA) []byte {
	var b []byte
	for _, ca := range cas {
		b = append(b, ca.PEM...)
	}
	return b
}

// Pool is a pool trusting the CAs.
func Pool(cas ...*CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Cert)
	}
	return p
}

// WriteFile replaces path's content at once: written beside it, then
// renamed over it.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n.Add(n, big.NewInt(1))
}
