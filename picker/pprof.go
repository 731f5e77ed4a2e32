package picker

import (
	"net/http"
	"net/http/pprof"
)

// pprofRoutes serves Go's profiles under /debug/pprof/ on mux (the admin
// surface only): the index, every named profile (heap, goroutine, allocs,
// block, mutex, threadcreate), cmdline, a CPU profile, symbol lookups and
// an execution trace. The handlers are registered here, explicitly: the
// net/http/pprof import also registers them on http.DefaultServeMux,
// which kvroute never serves. A CPU profile or trace longer than the admin
// server's write timeout (a minute) is refused by the handler.
func pprofRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
