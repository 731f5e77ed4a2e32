package picker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/tenant"
)

// secretPoll is how often a secret file is checked for a change (a
// Kubernetes Secret or cert-manager rotation swaps the file).
const secretPoll = 2 * time.Second

// secret is a file the picker holds a secret from: the tenant salt key,
// the decision API's token, the engines' API key. Its content, surrounding
// white space trimmed, is checked by parse and installed by install; the
// file is re-read when its size or modification time changes.
type secret struct {
	name    string // the metric label: salt_key, decision_token, engine_api_key
	flag    string // the flag that names the file, for messages
	path    string
	parse   func(b []byte) error // nil: any non-empty content
	install func(b []byte)
}

// read reads the file once: its content checked and installed. The
// secret never appears in an error.
func (s *secret) read() (os.FileInfo, error) {
	st, err := os.Stat(s.path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.flag, err)
	}
	raw, err := os.ReadFile(s.path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.flag, err)
	}
	b := bytes.TrimSpace(raw)
	switch {
	case len(b) == 0:
		err = errors.New("the file is empty")
	case s.parse != nil:
		err = s.parse(b)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", s.flag, s.path, err)
	}
	s.install(b)
	return st, nil
}

// watch re-reads the file when it changes, until ctx ends; a file that
// cannot be read or holds no usable secret keeps the one installed
// before, logged once per distinct failure and counted.
func (s *secret) watch(ctx context.Context, last os.FileInfo, log *zap.Logger, reloads *prometheus.CounterVec) {
	t := time.NewTicker(secretPoll)
	defer t.Stop()
	failing := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := os.Stat(s.path)
		if err == nil && last != nil && st.Size() == last.Size() && st.ModTime().Equal(last.ModTime()) {
			continue
		}
		st, err = s.read()
		if err != nil {
			if err.Error() != failing {
				failing = err.Error()
				reloads.WithLabelValues(s.name, "error").Inc()
				log.Warn("a secret file cannot be read; keeping the secret loaded before", zap.String("secret", s.name), zap.Error(err))
			}
			continue
		}
		failing, last = "", st
		reloads.WithLabelValues(s.name, "ok").Inc()
		log.Info("secret reloaded", zap.String("secret", s.name), zap.String("file", s.path))
	}
}

// saltKey is the tenant salt key file (--salt-key-file): at least
// tenant.MinKeyBytes (`openssl rand -base64 32` writes one such line).
func saltKey(path string, r *Router) *secret {
	var s *tenant.Salter
	return &secret{name: "salt_key", flag: "--salt-key-file", path: path,
		parse: func(b []byte) (err error) {
			if s, err = tenant.NewSalter(b); err != nil {
				return fmt.Errorf("%w (make one with: openssl rand -base64 32)", err)
			}
			return nil
		},
		install: func([]byte) { r.SetSalter(s) }}
}
