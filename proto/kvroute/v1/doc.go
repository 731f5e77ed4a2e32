// Package kvroutev1 holds kvroute's gRPC API, generated from the .proto
// files beside this one by `make proto` (never edited by hand): the
// Sidecar service a picker watches for summaries and load. One hand-written
// file, feeds.go, restores the compact updates of a stream (Feeds).
package kvroutev1
