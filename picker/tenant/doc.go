// Package tenant derives a request's cache_salt from the tenant an
// authenticating gateway names, so that tenant isolation does not rest on
// what the client sends (vLLM documents why salts exist: prompt reuse
// across tenants is observable through time to first token).
//
// Contract:
//   - A Salter is keyed: the salt of a tenant is an HMAC-SHA256 of its
//     name under the deployment's key, so salts cannot be guessed from
//     tenant names, nor carried from one deployment to another. The same
//     key and tenant always give the same salt; different tenants never
//     share one (up to the HMAC's collisions).
//   - SetSalt replaces a JSON object body's top-level cache_salt with the
//     derived one (adding it when absent), keeping every other member:
//     the body forwarded to the engine carries the salt the keys were
//     computed with, so the engine's cache is isolated the same way.
//     SetMembers is the same for any top-level members (SetSalt is it
//     with cache_salt alone): a caller setting several edits once.
//   - Tenant names are validated (CheckTenant): bounded, printable, no
//     surrounding space.
//   - The package is pure: no I/O, no clock, no logging. Reading and
//     re-reading the key file is the caller's.
package tenant
