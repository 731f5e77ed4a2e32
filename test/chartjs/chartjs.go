package chartjs

import _ "embed"

//go:embed chart.umd.min.js
var source string

// Source returns Chart.js's minified source.
func Source() string { return source }
