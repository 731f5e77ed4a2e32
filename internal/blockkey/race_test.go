//go:build race

package blockkey

// The race detector's instrumentation moves some stack buffers to the heap.
const raceEnabled = true
