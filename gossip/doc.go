// Package gossip is a payload-agnostic wrapper over hashicorp/memberlist:
// membership, failure detection and small node metadata (role, gRPC
// address, endpoints served, identity group, summary digests) for sidecars
// and pickers (DESIGN.md §6).
//
// Status: contract only. The implementation lands with the dissemination
// issue.
package gossip
