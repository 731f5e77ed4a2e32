package metrictest

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sum is the sum of the series of the family name in fams whose labels
// include every pair of labels (nil: all of them).
func Sum(fams []*dto.MetricFamily, name string, labels map[string]string) float64 {
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if has(m, labels) {
				sum += value(m)
			}
		}
	}
	return sum
}

// Series counts the series of the family name in fams whose labels
// include every pair of labels.
func Series(fams []*dto.MetricFamily, name string, labels map[string]string) int {
	n := 0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if has(m, labels) {
				n++
			}
		}
	}
	return n
}

func has(m *dto.Metric, labels map[string]string) bool {
	found := 0
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			found++
		}
	}
	return found == len(labels)
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	case m.Summary != nil:
		return float64(m.Summary.GetSampleCount())
	}
	return 0
}

// Gathered is Sum over what g gathers now.
func Gathered(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics for %s: %v", name, err)
	}
	return Sum(fams, name, labels)
}

// Families fetches url (a /metrics page) and parses its text exposition.
func Families(t testing.TB, url string) []*dto.MetricFamily {
	t.Helper()
	fams, err := Fetch(url)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// Fetch is Families for a caller that polls: an error instead of a
// failed test.
func Fetch(url string) ([]*dto.MetricFamily, error) {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("scraping %s: %s: %s", url, resp.Status, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", url, err)
	}
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		out = append(out, f)
	}
	return out, nil
}

// Scraped is Sum over the text exposition at url (a /metrics page).
func Scraped(t testing.TB, url, name string, labels map[string]string) float64 {
	t.Helper()
	return Sum(Families(t, url), name, labels)
}
