// Package metrictest reads metric values in tests, with the Prometheus
// client library's own types and parser: from a registry (Gathered), from
// a /metrics page over HTTP (Scraped), or from families already gathered
// or parsed (Sum). Every test in the tree reads metrics through it or
// through prometheus/testutil (ToFloat64 on a collector, GatherAndCompare
// and ScrapeAndCompare against expected exposition text), never with a
// scanner of its own.
//
// Contract:
//   - A value is the sum over the family's series whose labels include
//     every given pair (nil: every series): a counter's, gauge's or
//     untyped value, a histogram's or summary's sample count. A family
//     not present sums to 0: a counter never incremented is not exported.
//   - A failure to gather, fetch or parse fails the test (t.Fatal), naming
//     what could not be read.
package metrictest
