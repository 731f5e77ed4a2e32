//go:build !race

package blockkey

const raceEnabled = false
