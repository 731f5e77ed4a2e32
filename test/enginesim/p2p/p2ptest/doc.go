// Package p2ptest is a scripted peer for tests of the P2P side channel's
// consumers: a raw TCP server on 127.0.0.1 that speaks the side channel's
// framing (a 4-byte big-endian length, then one JSON object) without the
// p2p package's checks, so a test can make it answer anything, hostile
// answers included.
//
// Contract: test-only; it binds 127.0.0.1 on a free port, answers each
// frame with what the test scripted, and closes every connection it
// accepted when the test closes it.
package p2ptest
