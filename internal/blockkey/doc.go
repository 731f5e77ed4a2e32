// Package blockkey computes block identities for prefix caching, of two
// kinds that are never mixed:
//
//   - Canonical keys (format FormatV1, "kvroute-xxh3-v1"): kvroute's own
//     chained 64-bit keys. The sidecar computes them from the token ids in
//     an engine's BlockStored events and the picker from a request's
//     tokens, with the same functions, so the two meet exactly. The root
//     folds in the model and LoRA adapter; block 0 folds in the cache salt;
//     each block folds in the multimodal items overlapping it; only full
//     blocks are keyed. Different salts never share a key.
//
//   - vLLM's own chain (SHA256CBOR): sha256 over canonical CBOR of
//     (parent digest, token tuple, extra keys or None), seeded by NONE_HASH,
//     reproducing vLLM's --prefix-caching-hash-algo sha256_cbor bit for bit,
//     and EventHash, the 64-bit form vLLM publishes in KV events. The
//     simulated engine uses it; routing never does.
//
// The package is pure: no I/O, clocks, randomness or logging. Functions that
// append to a dst slice allocate only when dst lacks capacity.
//
// Canonical key format v1 (little-endian integers; any change bumps the
// version):
//
//	root   = XXH3-64("kvroute/v1" 0x00 model 0x00 lora)
//	key[i] = XXH3-64(le64(key[i-1] or root) || le32(B) || le32(token)×B || extras(i))
//	extra  = tag(1 byte) || le32(len(payload)) || payload
//	         tag 1 cache salt  (block 0 only)  payload = salt bytes
//	         tag 2 multimodal item             payload = le64(offset − block start) || identifier
//	         tag 3 prompt-embeds digest        payload = digest bytes
//
// extras(i) lists the salt first, then the items overlapping block i in
// request order.
package blockkey
