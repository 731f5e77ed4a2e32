//go:build race

package summary

// The race detector's instrumentation keeps temporaries the compiler
// otherwise elides (slices.Grow's).
const raceEnabled = true
