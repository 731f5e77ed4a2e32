package picker

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestSampler: the access log takes exactly the share of requests asked
// for, spread evenly.
func TestSampler(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		want int // of 1,000
	}{{0, 0}, {1, 1000}, {0.1, 100}, {0.25, 250}, {0.5, 500}, {0.001, 1}} {
		s := &sampler{rate: tc.rate}
		got, gap, last := 0, 0, -1
		for i := range 1000 {
			if s.take() {
				got++
				if last >= 0 {
					gap = max(gap, i-last)
				}
				last = i
			}
		}
		if got != tc.want {
			t.Fatalf("rate %v: %d of 1000, want %d", tc.rate, got, tc.want)
		}
		if tc.rate > 0 && tc.rate < 1 && gap > int(1/tc.rate)+1 {
			t.Fatalf("rate %v: a gap of %d requests", tc.rate, gap)
		}
	}
}

// TestRequestID: a client's id is kept when it is 1..128 visible ASCII
// characters, else replaced by a fresh 32-hex-digit one.
func TestRequestID(t *testing.T) {
	for got, keep := range map[string]bool{
		"abc-123": true, strings.Repeat("x", 128): true, "": false, strings.Repeat("x", 129): false,
		"has space": false, "new\nline": false, "naïve": false,
	} {
		id := requestID(got)
		if keep != (id == got) {
			t.Fatalf("%q became %q", got, id)
		}
		if !keep && (len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "") {
			t.Fatalf("%q replaced by %q", got, id)
		}
	}
	if a, b := requestID(""), requestID(""); a == b {
		t.Fatal("two made ids are equal")
	}
}

// TestAccessLogNamesTheKVSource: a proxied request's access-log line
// carries the KV source named for it, and none when none was.
func TestAccessLogNamesTheKVSource(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	r := &Router{cfg: DefaultConfig(), accessLog: zap.New(core)}
	r.access.rate = 1
	r.m = newMetrics(prometheus.NewRegistry(), r)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	for _, src := range []string{"10.0.0.2:5710", ""} {
		rec := &reqRecord{id: "r", endpoint: "http://10.0.0.1:8000", attempts: 1, cached: -1, kvSource: src}
		r.finish(req, &recorder{ResponseWriter: httptest.NewRecorder(), status: 200}, rec, time.Now(), false)
		entries := logs.TakeAll()
		if len(entries) != 1 {
			t.Fatalf("%d lines", len(entries))
		}
		got, has := entries[0].ContextMap()["kv_source"]
		if (src != "") != has || has && got != src {
			t.Fatalf("source %q: the line has kv_source %v (%v)", src, got, has)
		}
	}
}
