// Package secretfile holds material a process reads from files that are
// rotated in place — secrets (keys, tokens), certificates with their keys,
// CA bundles — and re-reads it when the files change, without a restart
// and without dropping connections. The picker uses it for its secrets,
// its TLS servers and its TLS client to the sidecars; the sidecar, for its
// gRPC server; gossip, for the keyring of both. It is a shell both
// components import, so it belongs to neither: it lives under gossip/,
// the tree of the shells the fleet's processes share (DESIGN.md §3 fixes
// the top level, and internal/ holds pure cores only). It imports
// nothing of kvroute's.
//
// Contract:
//   - Open reads and parses a File's files once; an error names the flags
//     and paths and what is wrong, never the content, so a process fails
//     at start with a message naming the flag.
//   - Check reads the files again (whole, at most 4 MiB each) and takes
//     their content when it changed and parses, atomically for Load:
//     material of several files (a certificate and its key) is taken
//     together or not at all. Content that cannot be read or used keeps
//     the material in use; once seen on two checks in a row (a pair of
//     files written one after the other is not reported between the
//     writes), it is logged at warn once and counted as an error, and
//     again only when the failure changes. Each reload is logged at info
//     with what it took (a certificate's subject, issuer, serial and
//     expiry; a bundle's CA subjects) and counted as ok. Content is
//     compared by digest, so a rewrite with the same bytes is no reload.
//   - Reload is Check on demand (a SIGHUP): it returns what is wrong with
//     the files, and reports a failure at once rather than on the second
//     sight.
//   - Watch checks files every interval (Poll, 2 s) until its context
//     ends; it starts no goroutine of its own.
//   - Metrics: kvroute_<subsystem>_secret_reloads_total{secret,result},
//     kvroute_<subsystem>_certificate_expiry_timestamp_seconds{secret}
//     (the first CA of a bundle to expire) and
//     kvroute_<subsystem>_tls_handshake_failures_total{server}, on the
//     Registerer given.
//   - No secret is ever logged, exported or put in an error: not a key,
//     not a token, not a file's bytes.
//   - TLS: ServerTLS builds a server's tls.Config whose GetConfigForClient
//     takes the certificate and the client CA bundle current at each
//     handshake; ClientConfig a client's for one connection (the bundle of
//     the moment as its roots, GetClientCertificate for the certificate),
//     and ClientCredentials gRPC credentials building one per handshake.
//     So a rotation applies to new connections and leaves open ones (long
//     gRPC streams) alone. A server with a client CA bundle requires and
//     verifies client certificates (client-auth usage); session tickets
//     are off, so no connection resumes past a change of CA. A client
//     verifies the server's chain and name (server-auth usage) with
//     crypto/tls's standard verification, against the bundle or the
//     system's roots, for the host dialled or a fixed server name. A
//     client asked for a certificate it has not got, or one the server's
//     acceptable CAs did not sign, ends the handshake itself with an error
//     saying so (with TLS 1.3 the server's refusal would otherwise race a
//     connection reset). ServerCredentials count every failed server
//     handshake (kvroute_<subsystem>_tls_handshake_failures_total{server})
//     and log them, a line per HandshakeLogEvery at most.
package secretfile
