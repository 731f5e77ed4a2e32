package metrictest

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func TestSumsMatchingSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"engine", "kind"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lat_seconds", Help: "lat"})
	reg.MustRegister(c, h)
	c.WithLabelValues("a", "chat").Add(2)
	c.WithLabelValues("a", "completion").Add(3)
	c.WithLabelValues("b", "chat").Add(5)
	h.Observe(0.1)
	h.Observe(0.2)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"x_total", nil, 10},
		{"x_total", map[string]string{"engine": "a"}, 5},
		{"x_total", map[string]string{"engine": "a", "kind": "chat"}, 2},
		{"x_total", map[string]string{"engine": "c"}, 0},
		{"x_total", map[string]string{"zone": "a"}, 0},
		{"lat_seconds", nil, 2},
		{"absent_total", nil, 0},
	} {
		if got := Gathered(t, reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("Gathered(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
		if got := Scraped(t, srv.URL, tc.name, tc.labels); got != tc.want {
			t.Errorf("Scraped(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if n := Series(Families(t, srv.URL), "x_total", map[string]string{"kind": "chat"}); n != 2 {
		t.Errorf("Series = %d, want 2", n)
	}
}

func TestFetchRefusesABadPage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "nope", http.StatusInternalServerError)
	}))
	defer srv.Close()
	if _, err := Fetch(srv.URL); err == nil {
		t.Fatal("a 500 was read as metrics")
	}
}
