// Package repo tests promises the repository makes about itself: the
// README's Quick start, what CI runs, what `make deps` says when it cannot
// install, and that every package states its contract in a doc.go.
package repo
