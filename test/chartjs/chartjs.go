// Package chartjs provides Chart.js (MIT; LICENSE.md), to inline in the
// bench's and the lab's HTML reports, so each report is one
// self-contained file that opens without a network.
package chartjs

import _ "embed"

//go:embed chart.umd.min.js
var source string

// Source returns Chart.js's minified source.
func Source() string { return source }
