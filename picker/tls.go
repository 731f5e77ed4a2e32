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
	check((c.PeerTLSCert == "") == (c.PeerTLSKey == "") && (c.PeerTLSCert == "") == (c.PeerTLSCA == ""),
		"--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together: the bookings streams between pickers are mutual TLS (each picker serves and follows with its certificate, verified against the CA bundle), or plaintext")
	check(c.PeerTLSServerName == "" || c.PeerTLSCA != "", "--peer-tls-server-name needs --peer-tls-ca: it is the name the other pickers' certificates are verified for")
	check(c.ExtProcClientCA == "" || c.ExtProcTLSCert != "",
		"--ext-proc-client-ca needs --ext-proc-tls-cert and --ext-proc-tls-key: client certificates are asked for in a TLS handshake")
	return errs
}

// tlsFiles is the picker's TLS material held from files: the credentials
// of its servers and of its client to the sidecars (nil: plaintext), and
// the files Watch re-reads.
type tlsFiles struct {
	sidecars credentials.TransportCredentials
	// peers and peerServer: the bookings streams between pickers, as a
	// follower and as the followed (nil: plaintext).
	peers, peerServer credentials.TransportCredentials
	grpc, extProc     credentials.TransportCredentials
	files             []secretfile.Checker
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
	if cfg.sharesBookings() && cfg.PeerTLSCert != "" {
		kp, err := pair("peer_tls", "--peer-tls-cert", cfg.PeerTLSCert, "--peer-tls-key", cfg.PeerTLSKey)
		if err != nil {
			return nil, err
		}
		roots, err := bundle("peer_ca", "--peer-tls-ca", cfg.PeerTLSCA)
		if err != nil {
			return nil, err
		}
		t.peerServer = secretfile.ServerCredentials("peer", kp, roots, m, log)
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
