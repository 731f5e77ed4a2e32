package picker

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip/secretfile"
	"github.com/kvroute/kvroute/picker/tenant"
)

// saltKey is the tenant salt key file (--salt-key-file): at least
// tenant.MinKeyBytes (`openssl rand -base64 32` writes one such line).
func saltKey(path string, r *Router) secretfile.Spec[*tenant.Salter] {
	return secretfile.Spec[*tenant.Salter]{Name: "salt_key", Flags: []string{"--salt-key-file"}, Paths: []string{path},
		Parse: func(c [][]byte) (*tenant.Salter, error) {
			var s *tenant.Salter
			key, err := secretfile.Secret("salt_key", "--salt-key-file", path, nil, nil).Parse(c)
			if err == nil {
				s, err = tenant.NewSalter(key)
			}
			if err != nil {
				return nil, fmt.Errorf("%w (make one with: openssl rand -base64 32)", err)
			}
			return s, nil
		},
		Install: r.SetSalter}
}

// openSecrets reads the secrets the picker holds from files, each
// installed as it is read and re-read by Watch when its file changes.
func (s *Server) openSecrets(cfg *ServerConfig, m *secretfile.Metrics, log *zap.Logger) ([]secretfile.Checker, error) {
	var files []secretfile.Checker
	add := func(f secretfile.Checker, err error) error {
		if err == nil {
			files = append(files, f)
		}
		return err
	}
	if cfg.SaltKeyFile != "" {
		if err := add(secretfile.Open(saltKey(cfg.SaltKeyFile, s.router), m, log)); err != nil {
			return nil, err
		}
	}
	if cfg.DecisionTokenFile != "" {
		spec := secretfile.Secret("decision_token", "--decision-token-file", cfg.DecisionTokenFile, nil,
			func(b []byte) { t := string(b); s.token.Store(&t) })
		if err := add(secretfile.Open(spec, m, log)); err != nil {
			return nil, err
		}
	}
	if cfg.EngineAPIKeyFile != "" {
		spec := secretfile.Secret("engine_api_key", "--engine-api-key-file", cfg.EngineAPIKeyFile, nil,
			func(b []byte) { s.router.SetEngineAPIKey(string(b)) })
		if err := add(secretfile.Open(spec, m, log)); err != nil {
			return nil, err
		}
	}
	return files, nil
}
