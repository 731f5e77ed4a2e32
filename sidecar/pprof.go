package sidecar

import (
	"net/http"
	"net/http/pprof"
)

// pprofRoutes are Go's profiles under /debug/pprof/ on the admin listener,
// served while the sidecar starts too: the index, every named profile
// (heap, goroutine, allocs, block, mutex, threadcreate), cmdline, a CPU
// profile, symbol lookups and an execution trace. They are registered on
// the admin mux explicitly: the net/http/pprof import also registers them
// on http.DefaultServeMux, which kvroute never serves.
func pprofRoutes() []adminRoute {
	var out []adminRoute
	for _, r := range []struct {
		pattern string
		h       http.HandlerFunc
	}{
		{"GET /debug/pprof/", pprof.Index},
		{"GET /debug/pprof/cmdline", pprof.Cmdline},
		{"GET /debug/pprof/profile", pprof.Profile},
		{"GET /debug/pprof/symbol", pprof.Symbol},
		{"POST /debug/pprof/symbol", pprof.Symbol},
		{"GET /debug/pprof/trace", pprof.Trace},
	} {
		out = append(out, adminRoute{pattern: r.pattern, serve: r.h, starting: r.h})
	}
	return out
}
