package picker

import (
	"crypto/tls"
	"errors"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvroute/kvroute/gossip/secretfile"
)

// validateTLS checks the TLS settings go together.
func (c *ServerConfig) validateTLS() []error {
	var errs []error
	check := func(ok bool, msg string) {
		if !ok {
			errs = append(errs, errors.New(msg))
		}
	}
	check((c.SidecarTLSCert == "") == (c.SidecarTLSKey == ""),
		"--sidecar-tls-cert and --sidecar-tls-key go together: give both (the client certificate the picker presents to the sidecars) or neither")
	check(c.SidecarTLSCert == "" || c.SidecarTLSCA != "",
		"--sidecar-tls-cert needs --sidecar-tls-ca: the CA bundle the sidecars' server certificates are verified against")
	check(c.SidecarTLSServerName == "" || c.SidecarTLSCA != "",
		"--sidecar-tls-server-name needs --sidecar-tls-ca: it is the name the sidecars' certificates are verified for")
	check((c.GRPCTLSCert == "") == (c.GRPCTLSKey == ""), "--grpc-tls-cert and --grpc-tls-key go together: give both or neither")
	check(c.GRPCClientCA == "" || c.GRPCTLSCert != "",
		"--grpc-client-ca needs --grpc-tls-cert and --grpc-tls-key: client certificates are asked for in a TLS handshake")
	check(c.GRPCTLSCert == "" || c.GRPCListen != "", "--grpc-tls-cert without --grpc-listen: the gRPC decision API is off")
	check(c.PeerTLSCA == "" || c.GRPCTLSCert != "",
		"--peer-tls-ca needs --grpc-tls-cert and --grpc-tls-key: a picker follows the others over TLS when it serves its own gRPC port with TLS, presenting that certificate")
	check(c.PeerTLSServerName == "" || c.PeerTLSCA != "", "--peer-tls-server-name needs --peer-tls-ca: it is the name the other pickers' certificates are verified for")
	if ca, _ := c.peerCA(); c.sharesBookings() && c.GRPCTLSCert != "" && ca == "" {
		errs = append(errs, errors.New("--grpc-tls-cert with other pickers to follow (gossip or --peer-pickers) needs --peer-tls-ca (or --grpc-client-ca): the other pickers serve TLS too, and their certificates are verified against it"))
	}
	check(c.ExtProcClientCA == "" || c.ExtProcTLSCert != "",
		"--ext-proc-client-ca needs --ext-proc-tls-cert and --ext-proc-tls-key: client certificates are asked for in a TLS handshake")
	return errs
}

// peerCA is the CA bundle the other pickers' certificates are verified
// against, and the flag that gave it: --peer-tls-ca, else
// --grpc-client-ca (the pickers' own CA, when they require client
// certificates), else none.
func (c *ServerConfig) peerCA() (path, flag string) {
	switch {
	case c.PeerTLSCA != "":
		return c.PeerTLSCA, "--peer-tls-ca"
	case c.GRPCClientCA != "":
		return c.GRPCClientCA, "--grpc-client-ca"
	}
	return "", ""
}

// tlsFiles is the picker's TLS material held from files: the credentials
// of its servers and of its client to the sidecars (nil: plaintext), and
// the files Watch re-reads.
type tlsFiles struct {
	sidecars      credentials.TransportCredentials
	peers         credentials.TransportCredentials // following the other pickers' bookings (nil: plaintext)
	grpc, extProc credentials.TransportCredentials
	files         []secretfile.Checker
}

// openTLS reads every TLS file configured; an error names the flag.
func openTLS(cfg *ServerConfig, m *secretfile.Metrics, log *zap.Logger) (*tlsFiles, error) {
	t := &tlsFiles{}
	pair := func(name, certFlag, cert, keyFlag, key string) (*secretfile.File[*tls.Certificate], error) {
		if cert == "" {
			return nil, nil
		}
		f, err := secretfile.Open(secretfile.KeyPair(name, certFlag, cert, keyFlag, key), m, log)
		if err == nil {
			t.files = append(t.files, f)
		}
		return f, err
	}
	bundle := func(name, flag, path string) (*secretfile.File[*secretfile.Bundle], error) {
		if path == "" {
			return nil, nil
		}
		f, err := secretfile.Open(secretfile.CABundle(name, flag, path), m, log)
		if err == nil {
			t.files = append(t.files, f)
		}
		return f, err
	}
	server := func(prefix, certFlag, cert, keyFlag, key, caFlag, ca string) (credentials.TransportCredentials, error) {
		kp, err := pair(prefix+"_tls", certFlag, cert, keyFlag, key)
		if kp == nil || err != nil {
			return nil, err
		}
		cas, err := bundle(prefix+"_client_ca", caFlag, ca)
		if err != nil {
			return nil, err
		}
		return secretfile.ServerCredentials(prefix, kp, cas, m, log), nil // cas nil: no client certificates asked for
	}
	var err error
	if t.grpc, err = server("grpc", "--grpc-tls-cert", cfg.GRPCTLSCert, "--grpc-tls-key", cfg.GRPCTLSKey, "--grpc-client-ca", cfg.GRPCClientCA); err != nil {
		return nil, err
	}
	if ca, caFlag := cfg.peerCA(); cfg.sharesBookings() && ca != "" {
		roots, err := bundle("peer_ca", caFlag, ca)
		if err != nil {
			return nil, err
		}
		kp, err := pair("peer_tls", "--grpc-tls-cert", cfg.GRPCTLSCert, "--grpc-tls-key", cfg.GRPCTLSKey)
		if err != nil {
			return nil, err
		}
		t.peers = secretfile.ClientCredentials(kp, roots, cfg.PeerTLSServerName)
	}
	if t.extProc, err = server("ext_proc", "--ext-proc-tls-cert", cfg.ExtProcTLSCert, "--ext-proc-tls-key", cfg.ExtProcTLSKey,
		"--ext-proc-client-ca", cfg.ExtProcClientCA); err != nil {
		return nil, err
	}
	if cfg.SidecarTLSCA != "" {
		roots, err := bundle("sidecar_ca", "--sidecar-tls-ca", cfg.SidecarTLSCA)
		if err != nil {
			return nil, err
		}
		kp, err := pair("sidecar_tls", "--sidecar-tls-cert", cfg.SidecarTLSCert, "--sidecar-tls-key", cfg.SidecarTLSKey)
		if err != nil {
			return nil, err
		}
		t.sidecars = secretfile.ClientCredentials(kp, roots, cfg.SidecarTLSServerName) // kp nil: no client certificate
	}
	return t, nil
}

// grpcCreds is the gRPC decision API's TLS option (none: plaintext).
func (t *tlsFiles) grpcCreds() grpc.ServerOption {
	if t.grpc == nil {
		return grpc.EmptyServerOption{}
	}
	return grpc.Creds(t.grpc)
}
