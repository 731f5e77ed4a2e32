//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package blockkey

import "encoding/binary"

// appendTokens appends tokens as little-endian 32-bit words.
func appendTokens(buf []byte, tokens []uint32) []byte {
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	return buf
}
