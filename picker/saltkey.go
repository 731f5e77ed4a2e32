package picker

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/tenant"
)

// saltKeyPoll is how often the salt key file is checked for a change
// (a Kubernetes Secret or cert-manager rotation swaps the file).
const saltKeyPoll = 2 * time.Second

// readSaltKey reads a salt key file: its content, surrounding white space
// trimmed (`openssl rand -base64 32` writes one such line), at least
// tenant.MinKeyBytes. The key never appears in an error.
func readSaltKey(path string) (*tenant.Salter, os.FileInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--salt-key-file: %w", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--salt-key-file: %w", err)
	}
	s, err := tenant.NewSalter(bytes.TrimSpace(b))
	if err != nil {
		return nil, nil, fmt.Errorf("--salt-key-file %s: %w (make one with: openssl rand -base64 32)", path, err)
	}
	return s, st, nil
}

// watchSaltKey re-reads the salt key file when it changes (its size or
// modification time), installing the new Salter; a file that cannot be
// read or holds no usable key keeps the old one, logged once per
// distinct failure and counted. It returns when ctx ends.
func (r *Router) watchSaltKey(ctx context.Context, path string, last os.FileInfo, log *zap.Logger, reloads *prometheus.CounterVec) {
	t := time.NewTicker(saltKeyPoll)
	defer t.Stop()
	failing := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := os.Stat(path)
		if err == nil && last != nil && st.Size() == last.Size() && st.ModTime().Equal(last.ModTime()) {
			continue
		}
		s, st, err := readSaltKey(path)
		if err != nil {
			if err.Error() != failing {
				failing = err.Error()
				reloads.WithLabelValues("error").Inc()
				log.Warn("the tenant salt key file cannot be read; keeping the key loaded before", zap.Error(err))
			}
			continue
		}
		failing, last = "", st
		r.SetSalter(s)
		reloads.WithLabelValues("ok").Inc()
		log.Info("tenant salt key reloaded", zap.String("file", path))
	}
}
