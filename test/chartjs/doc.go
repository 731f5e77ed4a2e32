// Package chartjs provides Chart.js (MIT; LICENSE.md), to inline in the
// bench's and the lab's HTML reports, so each report is one
// self-contained file that opens without a network.
//
// Contract: Source returns the minified library as shipped, unchanged; the
// package holds nothing else.
package chartjs
