// Package simsidecar is a simulated sidecar for picker-side tests and
// benchmarks at scales real engines cannot reach on one machine: a real
// gRPC server speaking kvroute.v1.Sidecar for one endpoint, whose summary
// is a real summary.Counting filled to capacity and turned over at a given
// rate (each stored block evicts one), with a delta every interval stamped
// with its oldest block's time, as a sidecar does; a watcher gets the
// snapshot and an idle engine's load report at once (a sidecar's first
// state), then the deltas and a load report every 200 ms. Keys added with Hold
// stay until the server stops. A Still sidecar neither churns nor ticks:
// its deltas are only those Hold sends, at once. Sent counts the bytes of
// updates sent on all streams, for fan-out figures. Only the engine and
// the sidecar's event intake are simulated; the stream, codec and
// summaries are the real ones.
package simsidecar
