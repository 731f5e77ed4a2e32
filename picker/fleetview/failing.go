package fleetview

import (
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Why a sidecar's summary stream cannot be kept (SidecarFailure.Reason).
const (
	// FailureTLS: a TLS handshake with the sidecar failed, or the sidecar
	// refused the picker's: no certificate, one it does not trust, a
	// server certificate the picker does not trust or not for the name.
	FailureTLS = "tls"
	// FailureUnavailable: the sidecar cannot be reached.
	FailureUnavailable = "unavailable"
	// FailureStream: the stream was reached and ended otherwise (a
	// refusal, a resync, a malformed update); it is opened again.
	FailureStream = "stream"
)

var failureReasons = []string{FailureTLS, FailureUnavailable, FailureStream}

// SidecarFailure is a sidecar the view follows whose summary stream is
// failing: since when, why, and the last error (which names no secret).
type SidecarFailure struct {
	Sidecar string
	Reason  string
	Error   string
	Since   time.Time
}

// failureReason classifies a stream's end. gRPC carries a transport's
// error as text, so TLS is recognised by crypto/tls's and crypto/x509's
// words: a handshake the picker failed ("authentication handshake
// failed", "x509: …") or one the sidecar refused ("remote error: tls: …").
func failureReason(err error) string {
	msg := err.Error()
	for _, w := range []string{"authentication handshake failed", "tls: ", "x509: "} {
		if strings.Contains(msg, w) {
			return FailureTLS
		}
	}
	if status.Code(err) == codes.Unavailable {
		return FailureUnavailable
	}
	return FailureStream
}

// failureHint is what a failure's log line adds for the operator.
func failureHint(reason string) string {
	switch reason {
	case FailureTLS:
		return "TLS with the sidecar failed: check the picker's --sidecar-tls-* files against the sidecar's --grpc-tls-cert and --grpc-client-ca"
	case FailureUnavailable:
		return "the sidecar cannot be reached (a picker dialling in plaintext a sidecar that serves TLS also ends here: give --sidecar-tls-ca)"
	}
	return ""
}

// setFailure records ref's failure (nil: its stream is up); a failure
// for the same reason as the one recorded keeps its start. Callers hold
// no lock.
func (v *View) setFailure(ref *streamRef, f *SidecarFailure) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if f != nil && ref.failure != nil && ref.failure.Reason == f.Reason {
		f.Since = ref.failure.Since
	}
	ref.failure = f
}

// Failing lists the sidecars followed whose summary stream is failing,
// sorted by address.
func (v *View) Failing() []SidecarFailure {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []SidecarFailure
	for _, ref := range v.streams {
		if ref.failure != nil {
			out = append(out, *ref.failure)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Sidecar < out[j].Sidecar })
	return out
}

// failingDesc describes kvroute_picker_sidecar_streams_failing.
var failingDesc = prometheus.NewDesc("kvroute_picker_sidecar_streams_failing",
	"Sidecars followed whose summary stream is failing, by reason: tls (a TLS handshake failed or was refused), unavailable (not reached), stream (ended otherwise).",
	[]string{"reason"}, nil)

// failingGauge counts the failing streams by reason when scraped.
type failingGauge struct{ v *View }

func (g failingGauge) Describe(ch chan<- *prometheus.Desc) { ch <- failingDesc }

func (g failingGauge) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	for _, f := range g.v.Failing() {
		n[f.Reason]++
	}
	for _, r := range failureReasons {
		ch <- prometheus.MustNewConstMetric(failingDesc, prometheus.GaugeValue, float64(n[r]), r)
	}
}
