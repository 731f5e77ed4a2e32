package sidecar

import (
	"context"

	"go.uber.org/zap"
	"google.golang.org/grpc/credentials"

	"github.com/kvroute/kvroute/gossip/secretfile"
)

// grpcTLS is the gRPC server's TLS material held from files: its
// certificate and, with --grpc-client-ca, the CA bundle pickers' client
// certificates are verified against; re-read when the files change.
type grpcTLS struct {
	creds credentials.TransportCredentials
	files []secretfile.Checker
}

// openGRPCTLS reads the gRPC server's TLS files (nil without
// GRPCTLSCert); an error names the flag. The reload and handshake metrics
// (kvroute_sidecar_secret_reloads_total,
// kvroute_sidecar_certificate_expiry_timestamp_seconds,
// kvroute_sidecar_tls_handshake_failures_total) go to m.
func openGRPCTLS(cfg *Config, m *secretfile.Metrics, log *zap.Logger) (*grpcTLS, error) {
	if cfg.GRPCTLSCert == "" {
		return nil, nil
	}
	kp, err := secretfile.Open(secretfile.KeyPair("grpc_tls", "--grpc-tls-cert", cfg.GRPCTLSCert, "--grpc-tls-key", cfg.GRPCTLSKey), m, log)
	if err != nil {
		return nil, err
	}
	t := &grpcTLS{files: []secretfile.Checker{kp}}
	var cas *secretfile.File[*secretfile.Bundle] // nil: no client certificate asked for
	if cfg.GRPCClientCA != "" {
		if cas, err = secretfile.Open(secretfile.CABundle("grpc_client_ca", "--grpc-client-ca", cfg.GRPCClientCA), m, log); err != nil {
			return nil, err
		}
		t.files = append(t.files, cas)
	}
	t.creds = secretfile.ServerCredentials("grpc", kp, cas, m, log.Named("grpc"))
	return t, nil
}

// watchTLS re-reads the TLS files every secretfile.Poll until ctx ends.
func (s *Sidecar) watchTLS(ctx context.Context) {
	if s.tls == nil {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		secretfile.Watch(ctx, secretfile.Poll, s.tls.files...)
	}()
}
