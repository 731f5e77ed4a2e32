// Package e2e holds tests that run kvroute's parts together over real
// sockets on 127.0.0.1: ZeroMQ through libzmq, HTTP, gRPC and memberlist.
// Every test picks free ports at run time, bounds its waits, and closes
// what it opens.
package e2e
