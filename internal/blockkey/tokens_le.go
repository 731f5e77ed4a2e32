//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package blockkey

import "unsafe"

// appendTokens appends tokens as little-endian 32-bit words. On
// little-endian machines that is their memory image, copied in one move.
func appendTokens(buf []byte, tokens []uint32) []byte {
	if len(tokens) == 0 {
		return buf
	}
	return append(buf, unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))...)
}
