package secretfile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Poll is how often a process checks its files (Watch): a Kubernetes
// Secret or cert-manager rotation swaps them in place.
const Poll = 2 * time.Second

// maxFileBytes bounds what is read of one file.
const maxFileBytes = 4 << 20

// Metrics are the series of a process's files: reloads by secret and
// result, and the expiry of each certificate in use.
type Metrics struct {
	reloads    *prometheus.CounterVec
	expiry     *prometheus.GaugeVec
	handshakes *prometheus.CounterVec
}

// NewMetrics registers kvroute_<subsystem>_secret_reloads_total{secret,result},
// kvroute_<subsystem>_certificate_expiry_timestamp_seconds{secret} and
// kvroute_<subsystem>_tls_handshake_failures_total{server} with reg (nil:
// not registered).
func NewMetrics(reg prometheus.Registerer, subsystem string) *Metrics {
	m := &Metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: subsystem, Name: "secret_reloads_total",
			Help: "Re-reads of a secret, certificate or CA file after it changed, by secret and result (error: the material loaded before is kept)."},
			[]string{"secret", "result"}),
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: subsystem, Name: "certificate_expiry_timestamp_seconds",
			Help: "When the certificate in use expires (its NotAfter, Unix seconds), by secret; for a CA bundle, its first CA to expire."},
			[]string{"secret"}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: subsystem, Name: "tls_handshake_failures_total",
			Help: "TLS handshakes a server of this process failed, by server: clients without a certificate, with one not trusted, in plaintext."},
			[]string{"server"}),
	}
	if reg != nil {
		reg.MustRegister(m.reloads, m.expiry, m.handshakes)
	}
	return m
}

// Spec says what a File holds and how it is read. Parse gets the files'
// contents in Paths' order and must never quote them in its error.
type Spec[T any] struct {
	// Name labels the metrics and the log lines: salt_key, grpc_tls, …
	Name string
	// Flags name the files' flags, one per path, for messages.
	Flags []string
	Paths []string
	Parse func(contents [][]byte) (T, error)
	// Describe, when set, is what the reload line says of new material
	// (a certificate's subject, serial and expiry): never a secret.
	Describe func(T) []zap.Field
	// Expiry, when set, is exported as the certificate expiry gauge.
	Expiry func(T) time.Time
	// Install, when set, is called with each value taken, the first at
	// Open; Check calls it under the File's lock.
	Install func(T)
}

// File is material held from files, re-read by Check when their content
// changes. Load is safe from any goroutine (a TLS handshake); Check is
// serialised by the File.
type File[T any] struct {
	spec Spec[T]
	m    *Metrics
	log  *zap.Logger
	cur  atomic.Pointer[T]

	mu      sync.Mutex
	digest  [32]byte // of the contents in use
	pending string   // a failure seen once, not reported yet
	failing string   // the failure reported, until the files are usable
}

// Open reads and parses the files once: the error names the flags and
// paths, never the content.
func Open[T any](spec Spec[T], m *Metrics, log *zap.Logger) (*File[T], error) {
	if len(spec.Paths) == 0 || len(spec.Flags) != len(spec.Paths) || spec.Parse == nil {
		return nil, fmt.Errorf("secretfile %s: a spec needs paths, a flag for each, and a parser", spec.Name)
	}
	if log == nil {
		log = zap.NewNop()
	}
	if m == nil {
		m = NewMetrics(nil, "")
	}
	f := &File[T]{spec: spec, m: m, log: log}
	contents, err := f.read()
	if err != nil {
		return nil, err
	}
	v, err := f.parse(contents)
	if err != nil {
		return nil, err
	}
	f.digest = digest(contents)
	f.install(v)
	return f, nil
}

// Load returns the material in use.
func (f *File[T]) Load() T { return *f.cur.Load() }

// Name is the spec's name.
func (f *File[T]) Name() string { return f.spec.Name }

// Check reads the files and takes their content when it changed and
// parses. Content that cannot be read or used keeps the material in use;
// it is reported (one warning, one error counted) once it has been seen
// on two checks in a row, so a pair of files written one after the other
// is not reported between the two writes, and again only when the failure
// changes. The first usable content after a failure is logged.
func (f *File[T]) Check() { _ = f.check(false) }

// Reload is Check on demand (an operator's SIGHUP): the files are read
// now, their content taken when it changed and parses, and what is wrong
// with them is returned (nil: usable) and reported at once, not on the
// second sight.
func (f *File[T]) Reload() error { return f.check(true) }

func (f *File[T]) check(now bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	contents, err := f.read()
	if err == nil {
		d := digest(contents)
		if d == f.digest { // unchanged, or back to the content in use
			if f.failing != "" {
				f.log.Info("secret file usable again: it holds the material in use", zap.String("secret", f.spec.Name))
			}
			f.pending, f.failing = "", ""
			return nil
		}
		var v T
		if v, err = f.parse(contents); err == nil {
			f.digest, f.pending, f.failing = d, "", ""
			f.install(v)
			f.m.reloads.WithLabelValues(f.spec.Name, "ok").Inc()
			fields := []zap.Field{zap.String("secret", f.spec.Name), zap.Strings("files", f.spec.Paths)}
			if f.spec.Describe != nil {
				fields = append(fields, f.spec.Describe(v)...)
			}
			f.log.Info("secret reloaded", fields...)
			return nil
		}
	}
	msg := err.Error()
	switch {
	case msg == f.failing: // reported already
	case msg != f.pending && !now: // seen once: maybe a write in progress
		f.pending = msg
	default:
		f.pending, f.failing = "", msg
		f.m.reloads.WithLabelValues(f.spec.Name, "error").Inc()
		f.log.Warn("a secret file cannot be read; keeping the secret loaded before", zap.String("secret", f.spec.Name), zap.Error(err))
	}
	return err
}

func (f *File[T]) install(v T) {
	f.cur.Store(&v)
	if f.spec.Expiry != nil {
		if t := f.spec.Expiry(v); !t.IsZero() {
			f.m.expiry.WithLabelValues(f.spec.Name).Set(float64(t.Unix()))
		}
	}
	if f.spec.Install != nil {
		f.spec.Install(v)
	}
}

// where names the files for messages: "--flag path, --flag path".
func (f *File[T]) where() string {
	parts := make([]string, len(f.spec.Paths))
	for i, p := range f.spec.Paths {
		parts[i] = f.spec.Flags[i] + " " + p
	}
	return strings.Join(parts, ", ")
}

func (f *File[T]) parse(contents [][]byte) (T, error) {
	v, err := f.spec.Parse(contents)
	if err != nil {
		return v, fmt.Errorf("%s: %w", f.where(), err)
	}
	return v, nil
}

func (f *File[T]) read() ([][]byte, error) {
	out := make([][]byte, len(f.spec.Paths))
	for i, p := range f.spec.Paths {
		b, err := readFile(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.spec.Flags[i], err)
		}
		out[i] = b
	}
	return out, nil
}

func readFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d MiB", path, maxFileBytes>>20)
	}
	return b, nil
}

func digest(contents [][]byte) [32]byte {
	h := sha256.New()
	for _, c := range contents {
		fmt.Fprintf(h, "%d:", len(c))
		h.Write(c)
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// Checker is what Watch checks: a File.
type Checker interface{ Check() }

// Watch checks every file every interval until ctx ends, then returns:
// run it on a goroutine the caller waits for.
func Watch(ctx context.Context, every time.Duration, files ...Checker) {
	if len(files) == 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, f := range files {
				f.Check()
			}
		}
	}
}

// Secret is the spec of a secret held as text in one file: its content,
// surrounding white space trimmed, not empty, and accepted by check (nil:
// any), handed to install.
func Secret(name, flag, path string, check func([]byte) error, install func([]byte)) Spec[[]byte] {
	return Spec[[]byte]{Name: name, Flags: []string{flag}, Paths: []string{path}, Install: install,
		Parse: func(c [][]byte) ([]byte, error) {
			b := bytes.TrimSpace(c[0])
			if len(b) == 0 {
				return nil, errors.New("the file is empty")
			}
			if check != nil {
				if err := check(b); err != nil {
					return nil, err
				}
			}
			return b, nil
		}}
}
