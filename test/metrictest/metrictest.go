package metrictest

import (
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
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

// Histogram is a histogram family's series whose labels include every
// given pair, summed: their cumulative buckets bound by bound, their
// sample counts and their sample sums.
type Histogram struct {
	// Buckets are the cumulative counts by upper bound, in ascending
	// order of bound: the bounds the series export (a registry's have no
	// +Inf bucket, a parsed page's end with one).
	Buckets []Bucket
	Count   uint64  // the number of observations
	Sum     float64 // the sum of the observations
}

// Bucket is a histogram's cumulative count of the observations at or
// below UpperBound.
type Bucket struct {
	UpperBound float64
	Count      uint64
}

// HistogramOf reads the histogram family name in fams, summed over the
// series whose labels include every pair of labels (nil: all of them).
// A family not present, or no series matching, reads as an empty
// Histogram.
func HistogramOf(fams []*dto.MetricFamily, name string, labels map[string]string) Histogram {
	var h Histogram
	counts := map[float64]uint64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !has(m, labels) || m.Histogram == nil {
				continue
			}
			mh := m.GetHistogram()
			h.Count += mh.GetSampleCount()
			h.Sum += mh.GetSampleSum()
			for _, b := range mh.GetBucket() {
				counts[b.GetUpperBound()] += b.GetCumulativeCount()
			}
		}
	}
	for _, bound := range slices.Sorted(maps.Keys(counts)) {
		h.Buckets = append(h.Buckets, Bucket{UpperBound: bound, Count: counts[bound]})
	}
	return h
}

// Quantile is the upper bound of the first bucket whose cumulative count
// reaches q of the observations (q·Count): a bucket bound, at or above
// the q quantile, not an interpolation within the bucket. It is +Inf when
// no finite bucket reaches it (the observations above the last bound),
// and the first bound of a histogram with no observations.
func (h Histogram) Quantile(q float64) float64 {
	for _, b := range h.Buckets {
		if float64(b.Count) >= q*float64(h.Count) {
			return b.UpperBound
		}
	}
	return math.Inf(1)
}

// Sub is what h observed since before, an earlier read of the same
// series: counts and sums are differences, bucket by bucket (a bound
// before lacks counts from 0).
func (h Histogram) Sub(before Histogram) Histogram {
	out := Histogram{Count: h.Count - before.Count, Sum: h.Sum - before.Sum}
	for _, b := range h.Buckets {
		for _, e := range before.Buckets {
			if e.UpperBound == b.UpperBound {
				b.Count -= e.Count
				break
			}
		}
		out.Buckets = append(out.Buckets, b)
	}
	return out
}

// LabelValues lists the values label takes over the series of the family
// name in fams whose labels include every pair of labels (nil: all of
// them), each once, sorted. A series without the label (or with it
// empty) adds none.
func LabelValues(fams []*dto.MetricFamily, name, label string, labels map[string]string) []string {
	seen := map[string]bool{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !has(m, labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() != "" {
					seen[lp.GetValue()] = true
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
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
	fams, err := Parse(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", url, err)
	}
	return fams, nil
}

// Parse reads a text exposition (a /metrics page's body) with the client
// library's parser, for a caller that fetches the page itself.
func Parse(r io.Reader) ([]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
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
