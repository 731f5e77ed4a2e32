package metrictest

import (
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
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

// histFixture is a registry with a labelled histogram (bounds 1, 2, 4)
// and a labelled gauge, read both as gathered and as a scraped page.
func histFixture(t *testing.T) (gathered, scraped []*dto.MetricFamily) {
	t.Helper()
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "d_seconds", Help: "d", Buckets: []float64{1, 2, 4}}, []string{"engine", "kind"})
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "info", Help: "i"}, []string{"name", "addr"})
	reg.MustRegister(h, g)
	for _, v := range []float64{0.5, 1.5, 3} {
		h.WithLabelValues("a", "chat").Observe(v)
	}
	for _, v := range []float64{0.5, 8} {
		h.WithLabelValues("b", "chat").Observe(v)
	}
	h.WithLabelValues("b", "completion").Observe(2)
	g.WithLabelValues("n1", "10.0.0.1:7946").Set(1)
	g.WithLabelValues("n2", "10.0.0.1:7947").Set(1)
	g.WithLabelValues("n2", "").Set(0)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	gathered, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return gathered, Families(t, srv.URL)
}

func TestHistogramOf(t *testing.T) {
	gathered, scraped := histFixture(t)
	inf := math.Inf(1)
	for _, tc := range []struct {
		labels  map[string]string
		buckets []Bucket // as gathered; the scraped page adds +Inf at Count
		count   uint64
		sum     float64
	}{
		{nil, []Bucket{{1, 2}, {2, 4}, {4, 5}}, 6, 15.5},
		{map[string]string{"engine": "a"}, []Bucket{{1, 1}, {2, 2}, {4, 3}}, 3, 5},
		{map[string]string{"kind": "chat"}, []Bucket{{1, 2}, {2, 3}, {4, 4}}, 5, 13.5},
		{map[string]string{"engine": "b", "kind": "completion"}, []Bucket{{1, 0}, {2, 1}, {4, 1}}, 1, 2},
		{map[string]string{"engine": "c"}, nil, 0, 0},
	} {
		want := Histogram{Buckets: tc.buckets, Count: tc.count, Sum: tc.sum}
		if got := HistogramOf(gathered, "d_seconds", tc.labels); !reflect.DeepEqual(got, want) {
			t.Errorf("gathered %v: %+v, want %+v", tc.labels, got, want)
		}
		if tc.buckets != nil {
			want.Buckets = append(slices.Clone(tc.buckets), Bucket{inf, tc.count})
		}
		if got := HistogramOf(scraped, "d_seconds", tc.labels); !reflect.DeepEqual(got, want) {
			t.Errorf("scraped %v: %+v, want %+v", tc.labels, got, want)
		}
	}
	if got := HistogramOf(gathered, "absent_seconds", nil); !reflect.DeepEqual(got, Histogram{}) {
		t.Errorf("an absent family: %+v", got)
	}
	if got := HistogramOf(gathered, "info", nil); !reflect.DeepEqual(got, Histogram{}) {
		t.Errorf("a gauge read as a histogram: %+v", got)
	}
}

func TestQuantile(t *testing.T) {
	h := Histogram{Buckets: []Bucket{{1, 2}, {2, 4}, {4, 5}}, Count: 6}
	withInf := Histogram{Buckets: append(slices.Clone(h.Buckets), Bucket{math.Inf(1), 6}), Count: 6}
	for _, tc := range []struct {
		h    Histogram
		q    float64
		want float64
	}{
		{h, 0, 1},
		{h, 0.3, 1},     // 1.8 ≤ 2
		{h, 1.0 / 3, 1}, // exactly reached
		{h, 0.5, 2},     // 3 ≤ 4
		{h, 0.8, 4},     // 4.8 ≤ 5
		{h, 0.99, math.Inf(1)},
		{withInf, 0.99, math.Inf(1)},
		{withInf, 0.5, 2},
		{Histogram{Buckets: []Bucket{{0.005, 0}, {0.01, 0}}}, 0.99, 0.005}, // nothing observed
		{Histogram{}, 0.5, math.Inf(1)},
	} {
		if got := tc.h.Quantile(tc.q); got != tc.want {
			t.Errorf("%+v.Quantile(%v) = %v, want %v", tc.h, tc.q, got, tc.want)
		}
	}
}

func TestSub(t *testing.T) {
	before := Histogram{Buckets: []Bucket{{1, 2}, {2, 3}}, Count: 4, Sum: 6}
	after := Histogram{Buckets: []Bucket{{1, 5}, {2, 9}, {4, 10}}, Count: 12, Sum: 20}
	want := Histogram{Buckets: []Bucket{{1, 3}, {2, 6}, {4, 10}}, Count: 8, Sum: 14}
	if got := after.Sub(before); !reflect.DeepEqual(got, want) {
		t.Errorf("Sub = %+v, want %+v", got, want)
	}
	if got := after.Sub(Histogram{}); !reflect.DeepEqual(got, after) {
		t.Errorf("Sub of nothing = %+v, want %+v", got, after)
	}
	if q := after.Sub(before).Quantile(0.5); q != 2 {
		t.Errorf("the median since before: %v, want 2 (after alone: %v)", q, after.Quantile(0.5))
	}
}

func TestLabelValues(t *testing.T) {
	gathered, scraped := histFixture(t)
	for _, tc := range []struct {
		name, label string
		labels      map[string]string
		want        []string
	}{
		{"info", "name", nil, []string{"n1", "n2"}},
		{"info", "addr", nil, []string{"10.0.0.1:7946", "10.0.0.1:7947"}},
		{"info", "addr", map[string]string{"name": "n2"}, []string{"10.0.0.1:7947"}},
		{"info", "name", map[string]string{"addr": "10.0.0.1:7946"}, []string{"n1"}},
		{"info", "zone", nil, nil},
		{"d_seconds", "kind", map[string]string{"engine": "b"}, []string{"chat", "completion"}},
		{"d_seconds", "engine", map[string]string{"kind": "chat"}, []string{"a", "b"}},
		{"d_seconds", "engine", map[string]string{"kind": "embed"}, nil},
		{"absent", "name", nil, nil},
	} {
		for src, fams := range map[string][]*dto.MetricFamily{"gathered": gathered, "scraped": scraped} {
			if got := LabelValues(fams, tc.name, tc.label, tc.labels); !slices.Equal(got, tc.want) {
				t.Errorf("%s: LabelValues(%s, %s, %v) = %q, want %q", src, tc.name, tc.label, tc.labels, got, tc.want)
			}
		}
	}
}

func TestParse(t *testing.T) {
	fams, err := Parse(strings.NewReader("# TYPE up gauge\nup{job=\"a\"} 1\nup{job=\"b\"} 0\n"))
	if err != nil || Series(fams, "up", nil) != 2 || Sum(fams, "up", map[string]string{"job": "a"}) != 1 {
		t.Errorf("Parse: %v %v", fams, err)
	}
	if _, err := Parse(strings.NewReader("up{job=\"a\" 1\n")); err == nil {
		t.Error("a malformed page parsed")
	}
}
