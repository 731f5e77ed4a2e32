// Package kvroutev1 holds kvroute's gRPC API, generated from the .proto
// files beside this one by `make proto` (never edited by hand): the
// Sidecar service a picker watches for summaries and load.
package kvroutev1
