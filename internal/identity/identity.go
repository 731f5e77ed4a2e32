package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Group is what makes two endpoints' keys comparable.
type Group struct {
	Model                string
	BlockSize            int
	KeyFormat            string
	SummaryParams        string
	TokenizerFingerprint string
}

// ID returns a short stable name for g: 12 hex digits of a SHA-256 over
// its fields.
func (g Group) ID() string {
	h := sha256.New()
	for _, f := range []string{g.Model, strconv.Itoa(g.BlockSize), g.KeyFormat, g.SummaryParams, g.TokenizerFingerprint} {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}
