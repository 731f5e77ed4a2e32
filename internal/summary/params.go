package summary

import (
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// BlockBits is the size of one Bloom block: a 64-byte cache line.
const BlockBits = 512

// ProbeV1 names the probe function below; a different function is a
// different version, and summaries of different versions are never mixed.
const ProbeV1 = "blocked512-splitmix-v1"

// MaxK bounds the probes per key.
const MaxK = 16

// Params are the fleet-wide summary parameters.
type Params struct {
	M     uint32 // bits; a positive multiple of BlockBits
	K     uint8  // probes per key, 1..MaxK
	Probe string // probe function version, ProbeV1
}

// BitsPerBlock is the sizing rule: 16 bits per cached block keeps the
// false-positive rate per probe under 1e-3 at capacity with K = 8.
const BitsPerBlock = 16

// DefaultK is the probe count for BitsPerBlock bits per key.
const DefaultK = 8

// ForCapacity returns parameters sized for capacity cached blocks.
func ForCapacity(capacity int) Params {
	if capacity < 1 {
		capacity = 1
	}
	blocks := (uint64(capacity)*BitsPerBlock + BlockBits - 1) / BlockBits
	return Params{M: uint32(blocks * BlockBits), K: DefaultK, Probe: ProbeV1}
}

// Validate checks p.
func (p Params) Validate() error {
	if p.M == 0 || p.M%BlockBits != 0 {
		return fmt.Errorf("summary: m = %d bits is not a positive multiple of %d", p.M, BlockBits)
	}
	if p.M > 1<<31 {
		return fmt.Errorf("summary: m = %d bits is too large", p.M)
	}
	if p.K == 0 || p.K > MaxK {
		return fmt.Errorf("summary: k = %d probes: want 1..%d", p.K, MaxK)
	}
	if p.Probe != ProbeV1 {
		return fmt.Errorf("summary: unknown probe function %q", p.Probe)
	}
	return nil
}

// ErrIncompatible reports summaries built with different parameters.
var ErrIncompatible = errors.New("summary: incompatible parameters")

// Compatible returns ErrIncompatible (wrapped, naming both) unless p == q.
func (p Params) Compatible(q Params) error {
	if p != q {
		return fmt.Errorf("%w: %s vs %s", ErrIncompatible, p, q)
	}
	return nil
}

// String formats p as m/k/probe.
func (p Params) String() string { return fmt.Sprintf("m=%d,k=%d,%s", p.M, p.K, p.Probe) }

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Probes writes key's k bit positions into dst and returns them, all in
// one BlockBits-bit block: the block comes from the high half of
// h = splitmix64(key); positions are successive 9-bit fields, seven to a
// word, of splitmix64(h+1), splitmix64(h+2), …. Two probes of a key may
// land on one position (p ≈ k²/1024), which leaves the false-positive
// rate at capacity ≈ 8.8e-4 instead of 8.7e-4 and saves the check.
func (p Params) Probes(key blockkey.Key, dst *[MaxK]uint32) []uint32 {
	h := splitmix(uint64(key))
	nblocks := uint64(p.M / BlockBits)
	base := uint32(((h >> 32) * nblocks) >> 32 * BlockBits) // fast range reduction of the high half
	out := dst[:p.K]
	x := splitmix(h + 1)
	for i := range out {
		if i == 7 || i == 14 {
			x = splitmix(h + uint64(i/7) + 1)
		}
		out[i] = base + uint32(x&(BlockBits-1))
		x >>= 9
	}
	return out
}
