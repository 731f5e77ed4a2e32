// Package fleet is the picker's fleet state: every endpoint the sidecars
// offer, its identity group, its last load report and, per identity group
// and tier, the bit-sliced index of every endpoint's summary.
//
// Contract:
//   - Values here are kvroute's own (Identity, Load, Endpoint), never
//     protobuf messages: the stream shell (picker/fleetview) converts.
//   - An endpoint belongs to the identity group of its model, block size,
//     key format, summary parameters and tokenizer fingerprint; endpoints
//     of different groups are never compared.
package fleet
