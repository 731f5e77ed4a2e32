// Package metrictest reads metric values in tests, with the Prometheus
// client library's own types and parser: from a registry (Gathered), from
// a /metrics page over HTTP (Scraped, Families, Fetch) or in hand
// (Parse), or from families already gathered or parsed (Sum, Series,
// HistogramOf, LabelValues). Every test in the tree reads metrics
// through it or through prometheus/testutil (ToFloat64 on a collector,
// GatherAndCompare and ScrapeAndCompare against expected exposition
// text), never with a scanner of its own.
//
// Contract:
//   - A value is the sum over the family's series whose labels include
//     every given pair (nil: every series): a counter's, gauge's or
//     untyped value, a histogram's or summary's sample count. A family
//     not present sums to 0: a counter never incremented is not exported.
//   - A histogram (HistogramOf) is the same sum over a histogram family's
//     matching series, of its cumulative buckets (bound by bound, in
//     ascending order of bound, as exported: a parsed page's include
//     +Inf, a registry's do not), its sample count and its sample sum;
//     absent, it is empty. Its Quantile(q) is the bound of the first
//     bucket whose cumulative count reaches q of the sample count — a
//     bucket bound, at or above the quantile, never interpolated — and
//     +Inf when no exported bucket reaches it. Sub gives what a histogram
//     observed since an earlier read of it.
//   - LabelValues are the distinct, non-empty values a label takes over a
//     family's matching series, sorted.
//   - A failure to gather, fetch or parse fails the test (t.Fatal), naming
//     what could not be read; Fetch, for a caller that polls, returns it.
package metrictest
