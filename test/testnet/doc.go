// Package testnet gives tests free loopback ports picked at run time, so
// every test binds 127.0.0.1 only and never a fixed port (no port is given
// out twice in one process: draws made before binding cannot collide);
// bounded waits on
// a condition (Await), never fixed sleeps; and TLS material made per test:
// a self-signed server certificate (SelfSigned), or certificate
// authorities signing server and client certificates for 127.0.0.1
// (NewCA), written to files the way a rotated Secret is (Files.Write: each
// file replaced at once).
package testnet
