package blockkey

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/test/vectors"
)

// TestVLLMCaptures reproduces, bit for bit, the block hashes a real vLLM
// published (sha256_cbor, PYTHONHASHSEED=42, block size 16), without and
// with LoRA "Alice".
func TestVLLMCaptures(t *testing.T) {
	for name, load := range map[string]func() (*vectors.Capture, error){"base": vectors.Base, "lora": vectors.LoRA} {
		t.Run(name, func(t *testing.T) {
			c, err := load()
			if err != nil {
				t.Fatal(err)
			}
			r := Request{Tokens: c.TokenIDs}
			if c.LoraName != nil {
				r.LoRA = *c.LoraName
			}
			if name == "lora" && r.LoRA != "Alice" {
				t.Fatalf("lora capture names %q", r.LoRA)
			}
			h := NewSHA256CBOR(Seed(c.HashSeed, true))
			digests, err := h.VLLMChain(&r, c.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			if len(digests) != len(c.BlockHashes) || len(digests) != 25 {
				t.Fatalf("%d digests, capture has %d", len(digests), len(c.BlockHashes))
			}
			for i, d := range digests {
				if got := EventHash(d); got != c.BlockHashes[i] {
					t.Errorf("block %d: %d, vLLM published %d", i, got, c.BlockHashes[i])
				}
			}
		})
	}
}

// TestDerivedSHA256CBOR checks every sha256_cbor case of the derived
// vectors: NONE_HASH, the serialized first block, all full digests and
// their event form.
func TestDerivedSHA256CBOR(t *testing.T) {
	d, err := vectors.DerivedHashes()
	if err != nil {
		t.Fatal(err)
	}
	base, err := vectors.Base()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, c := range d.Cases {
		if c.Algo != HashAlgoSHA256CBOR {
			continue
		}
		seen++
		r := Request{Tokens: base.TokenIDs}
		desc := ""
		if c.ExtraKeys != nil {
			desc = *c.ExtraKeys
		}
		switch {
		case desc == "":
		case strings.HasPrefix(desc, "cache_salt='tenant-a'"):
			r.CacheSalt = "tenant-a"
		case strings.HasPrefix(desc, "LoRA lora_name='Alice'"):
			r.LoRA = "Alice"
		default:
			t.Fatalf("case with unrecognised extra keys %q", desc)
		}
		name := c.Seed + "/" + desc
		h := NewSHA256CBOR(c.Seed)
		none := h.NoneHash()
		if hex.EncodeToString(none[:]) != c.NoneHashHex {
			t.Errorf("%s: NONE_HASH %x, want %s", name, none, c.NoneHashHex)
		}
		first, err := AppendBlockCBOR(nil, none, r.Tokens[:d.BlockSize], r.VLLMExtraKeys(0, d.BlockSize))
		if err != nil {
			t.Fatal(err)
		}
		if hex.EncodeToString(first) != c.FirstBlockHex {
			t.Errorf("%s: first block CBOR\n%x\nwant\n%s", name, first, c.FirstBlockHex)
		}
		digests, err := h.VLLMChain(&r, d.BlockSize)
		if err != nil {
			t.Fatal(err)
		}
		if len(digests) != len(c.FullHex) || len(digests) != len(c.EventUint64) {
			t.Fatalf("%s: %d digests, want %d", name, len(digests), len(c.FullHex))
		}
		for i, dg := range digests {
			if hex.EncodeToString(dg[:]) != c.FullHex[i] {
				t.Errorf("%s: block %d digest %x, want %s", name, i, dg, c.FullHex[i])
			}
			if EventHash(dg) != c.EventUint64[i] {
				t.Errorf("%s: block %d event hash %d, want %d", name, i, EventHash(dg), c.EventUint64[i])
			}
		}
	}
	if seen != 4 {
		t.Fatalf("checked %d sha256_cbor cases, the vectors have 4", seen)
	}
}

func TestSeed(t *testing.T) {
	if Seed("", false) != DefaultSeed || Seed("42", true) != "42" || Seed("", true) != "" {
		t.Fatal("Seed resolution")
	}
	a, b := NewSHA256CBOR("1").NoneHash(), NewSHA256CBOR("2").NoneHash()
	if a == b {
		t.Fatal("different seeds give one NONE_HASH")
	}
}

// TestChainContinues: a run chained from a parent digest equals the tail of
// the whole chain, as vLLM's events for later runs carry.
func TestChainContinues(t *testing.T) {
	c, err := vectors.Base()
	if err != nil {
		t.Fatal(err)
	}
	h := NewSHA256CBOR("42")
	all, err := h.AppendChain(nil, nil, 16, c.TokenIDs, nil)
	if err != nil {
		t.Fatal(err)
	}
	head, _ := h.AppendChain(nil, nil, 16, c.TokenIDs[:160], nil)
	tail, _ := h.AppendChain(nil, &head[9], 16, c.TokenIDs[160:], nil)
	if len(head)+len(tail) != len(all) {
		t.Fatal("lengths")
	}
	for i, d := range tail {
		if d != all[10+i] {
			t.Fatalf("block %d differs when chained from its parent", 10+i)
		}
	}
	// A partial tail is not hashed.
	part, _ := h.AppendChain(nil, nil, 16, c.TokenIDs[:40], nil)
	if len(part) != 2 {
		t.Fatalf("%d digests for 40 tokens", len(part))
	}
	if _, err := h.AppendChain(nil, nil, 0, c.TokenIDs, nil); err == nil {
		t.Fatal("block size 0 accepted")
	}
}

func TestCBORValues(t *testing.T) {
	var parent Digest
	cases := []struct {
		extra []any
		tail  string // hex of the extra-keys part
	}{
		{nil, "f6"},
		{[]any{}, "f6"},
		{[]any{"a"}, "816161"},
		{[]any{[]byte{1, 2}}, "81420102"},
		{[]any{int64(-1), -25, 24, uint64(1 << 40)}, "8420381818181b0000010000000000"},
		{[]any{[]any{"img", int64(-3)}}, "818263696d6722"},
		{[]any{true, false, nil}, "83f5f4f6"},
	}
	for _, c := range cases {
		b, err := AppendBlockCBOR(nil, parent, []uint32{0, 23, 24, 255, 256, 65535, 65536}, c.extra)
		if err != nil {
			t.Fatal(err)
		}
		head := "835820" + strings.Repeat("00", 32) + "87" + "00" + "17" + "1818" + "18ff" + "190100" + "19ffff" + "1a00010000"
		if got := hex.EncodeToString(b); got != head+c.tail {
			t.Errorf("extra %v:\n got %s\nwant %s", c.extra, got, head+c.tail)
		}
	}
	if _, err := AppendBlockCBOR(nil, parent, nil, []any{1.5}); err == nil {
		t.Error("float extra key accepted")
	}
	deep := []any{"x"}
	for i := 0; i < 10; i++ {
		deep = []any{deep}
	}
	if _, err := AppendBlockCBOR(nil, parent, nil, deep); err == nil {
		t.Error("deep extra keys accepted")
	}
	if _, err := NewSHA256CBOR("x").Block(parent, nil, []any{map[string]int{}}); err == nil {
		t.Error("map extra key accepted")
	}
}
