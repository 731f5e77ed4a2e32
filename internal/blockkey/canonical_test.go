package blockkey

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/test/vectors"
)

var update = flag.Bool("update", false, "rewrite golden files")

func randTokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(rng.IntN(151_000))
	}
	return t
}

// TestGoldenV1 pins format v1: any change to the key bytes fails here, and
// must come with a new format version, not a regenerated golden file.
func TestGoldenV1(t *testing.T) {
	c, err := vectors.Base()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "format %s\n", FormatV1)
	cases := []struct {
		name  string
		model string
		req   Request
		bs    int
	}{
		{"plain", "Qwen/Qwen3-0.6B", Request{Tokens: c.TokenIDs}, 16},
		{"lora", "Qwen/Qwen3-0.6B", Request{Tokens: c.TokenIDs, LoRA: "Alice"}, 16},
		{"salt", "Qwen/Qwen3-0.6B", Request{Tokens: c.TokenIDs, CacheSalt: "tenant-a"}, 16},
		{"mm", "Qwen/Qwen3-0.6B", Request{Tokens: c.TokenIDs, CacheSalt: "tenant-a",
			MM: []MMItem{{"img-1", 10, 40}, {"img-2", 64, 16}}}, 16},
		{"block64", "Qwen/Qwen3-0.6B", Request{Tokens: c.TokenIDs}, 64},
		{"other-model", "openai/gpt-oss-20b", Request{Tokens: c.TokenIDs}, 16},
	}
	for _, k := range cases {
		keys := k.req.AppendKeys(nil, k.model, k.bs)
		fmt.Fprintf(&b, "%s root=%s", k.name, Root(k.model, k.req.LoRA))
		for _, key := range keys {
			fmt.Fprintf(&b, " %s", key)
		}
		b.WriteString("\n")
	}
	const path = "testdata/canonical_v1.golden"
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Fatalf("canonical keys differ from %s:\n%s", path, b.String())
	}
}

func TestKeyText(t *testing.T) {
	for _, k := range []Key{0, 1, 0xdeadbeef, ^Key(0)} {
		s := k.String()
		if len(s) != 16 || strings.ToLower(s) != s {
			t.Fatalf("%d formats as %q", k, s)
		}
		if back, err := ParseKey(s); err != nil || back != k {
			t.Fatalf("ParseKey(%q) = %v, %v", s, back, err)
		}
	}
	for _, bad := range []string{"", "123", "zzzzzzzzzzzzzzzz", "+123456789abcdef", "0123456789abcdef0"} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
}

// TestSaltsShareNoKey: two different salts, or a salt and none, share no
// key at any depth, whatever the tokens.
func TestSaltsShareNoKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		tokens := randTokens(rng, 16*(1+rng.IntN(40)))
		salts := []string{"", "tenant-a", "tenant-b", fmt.Sprintf("s%d", trial), "tenant-a\x00"}
		seen := map[Key]string{}
		for _, s := range salts {
			r := Request{Tokens: tokens, CacheSalt: s}
			for _, k := range r.AppendKeys(nil, "m", 16) {
				if other, ok := seen[k]; ok {
					t.Fatalf("salts %q and %q share key %s", other, s, k)
				}
				seen[k] = s
			}
		}
	}
	// A salt never collides with a LoRA of the same name (vLLM's untagged
	// extra keys do collide: issue #44701).
	tokens := randTokens(rng, 64)
	salted := (&Request{Tokens: tokens, CacheSalt: "X"}).AppendKeys(nil, "m", 16)
	lora := (&Request{Tokens: tokens, LoRA: "X"}).AppendKeys(nil, "m", 16)
	for i := range salted {
		if salted[i] == lora[i] {
			t.Fatalf("salt X and LoRA X share block %d", i)
		}
	}
}

// TestPrefixProperty: the keys of a prompt are a prefix of the keys of any
// longer prompt extending it; equal inputs give equal keys.
func TestPrefixProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 300; trial++ {
		bs := []int{1, 4, 16, 64, 128}[rng.IntN(5)]
		long := randTokens(rng, rng.IntN(3000))
		cut := rng.IntN(len(long) + 1)
		salt := []string{"", "t"}[rng.IntN(2)]
		var mm []MMItem
		if rng.IntN(2) == 0 && len(long) > 10 {
			off := rng.IntN(len(long) - 5)
			mm = []MMItem{{"img", off, 1 + rng.IntN(len(long)-off)}}
		}
		full := Request{Tokens: long, CacheSalt: salt, MM: mm, LoRA: "l"}
		short := Request{Tokens: long[:cut], CacheSalt: salt, MM: mm, LoRA: "l"}
		a := full.AppendKeys(nil, "m", bs)
		b := short.AppendKeys(nil, "m", bs)
		if len(a) != len(long)/bs || len(b) != cut/bs {
			t.Fatalf("keyed %d/%d blocks of %d/%d tokens at block size %d", len(a), len(b), len(long), cut, bs)
		}
		for i := range b {
			if a[i] != b[i] {
				t.Fatalf("trial %d: block %d differs between a prompt and its extension", trial, i)
			}
		}
		again := (&Request{Tokens: append([]uint32(nil), long...), CacheSalt: salt, MM: mm, LoRA: "l"}).AppendKeys(nil, "m", bs)
		for i := range a {
			if again[i] != a[i] {
				t.Fatal("equal inputs gave different keys")
			}
		}
	}
}

// TestIdentityChangesEveryKey: model, LoRA and block size each change every key.
func TestIdentityChangesEveryKey(t *testing.T) {
	tokens := randTokens(rand.New(rand.NewPCG(5, 6)), 256)
	base := (&Request{Tokens: tokens}).AppendKeys(nil, "m", 16)
	variants := map[string][]Key{
		"model":     (&Request{Tokens: tokens}).AppendKeys(nil, "m2", 16),
		"lora":      (&Request{Tokens: tokens, LoRA: "a"}).AppendKeys(nil, "m", 16),
		"model-nul": (&Request{Tokens: tokens}).AppendKeys(nil, "m\x00", 16),
	}
	for name, keys := range variants {
		for i := range base {
			if keys[i] == base[i] {
				t.Errorf("%s: block %d unchanged", name, i)
			}
		}
	}
	b32 := (&Request{Tokens: tokens}).AppendKeys(nil, "m", 32)
	for i := range b32 {
		for _, k := range base {
			if b32[i] == k {
				t.Fatalf("block size 32 shares a key with block size 16")
			}
		}
	}
}

// TestMMExtras: a multimodal item changes exactly the blocks it overlaps and
// all that follow; its identifier and position both count.
func TestMMExtras(t *testing.T) {
	tokens := randTokens(rand.New(rand.NewPCG(7, 8)), 160)
	plain := (&Request{Tokens: tokens}).AppendKeys(nil, "m", 16)
	item := MMItem{"img-a", 40, 30} // blocks 2, 3 and 4 (tokens 40..69)
	with := (&Request{Tokens: tokens, MM: []MMItem{item}}).AppendKeys(nil, "m", 16)
	for i := range plain {
		if (i < 2) != (plain[i] == with[i]) {
			t.Errorf("block %d: changed=%v", i, plain[i] != with[i])
		}
	}
	other := (&Request{Tokens: tokens, MM: []MMItem{{"img-b", 40, 30}}}).AppendKeys(nil, "m", 16)
	moved := (&Request{Tokens: tokens, MM: []MMItem{{"img-a", 41, 29}}}).AppendKeys(nil, "m", 16)
	if other[2] == with[2] || moved[2] == with[2] {
		t.Error("identifier or offset does not change the key")
	}
	r := Request{MM: []MMItem{item}}
	for i, want := range [][]Extra{nil, nil, {{ExtraMM, "img-a", 8}}, {{ExtraMM, "img-a", -8}}, {{ExtraMM, "img-a", -24}}, nil} {
		got := r.BlockExtras(nil, i, 16)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("block %d extras %v, want %v", i, got, want)
		}
		vk := r.VLLMExtraKeys(i, 16)
		if (len(vk) == 0) != (len(want) == 0) {
			t.Errorf("block %d: vLLM extra keys %v, canonical %v", i, vk, want)
		}
	}
	// An item ending exactly at a block boundary does not touch the next block.
	edge := Request{MM: []MMItem{{"x", 0, 16}}}
	if len(edge.BlockExtras(nil, 1, 16)) != 0 || len(edge.BlockExtras(nil, 0, 16)) != 1 {
		t.Error("boundary item overlap")
	}
}

// TestChainAgreesWithRequest: the sidecar's path (AppendChain over runs with
// per-block extras, continued from a parent) equals the picker's path
// (Request.AppendKeys over the whole prompt).
func TestChainAgreesWithRequest(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for trial := 0; trial < 100; trial++ {
		bs := 16
		r := Request{Tokens: randTokens(rng, bs*(1+rng.IntN(50))), CacheSalt: "s", LoRA: "l",
			MM: []MMItem{{"i", rng.IntN(100), 1 + rng.IntN(100)}}}
		want := r.AppendKeys(nil, "m", bs)
		n := len(r.Tokens) / bs
		extras := make([][]Extra, n)
		for i := range extras {
			extras[i] = r.BlockExtras(nil, i, bs)
		}
		split := rng.IntN(n + 1)
		got := AppendChain(nil, Root("m", "l"), bs, r.Tokens[:split*bs], extras[:split])
		parent := Root("m", "l")
		if split > 0 {
			parent = got[split-1]
		}
		got = AppendChain(got, parent, bs, r.Tokens[split*bs:], extras[split:])
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("trial %d: chained runs differ from the request's keys", trial)
		}
		if Next(Root("m", "l"), r.Tokens[:bs], extras[0]) != want[0] {
			t.Fatal("Next differs from AppendChain")
		}
	}
	if got := AppendChain(nil, 1, 0, []uint32{1, 2}, nil); len(got) != 0 {
		t.Fatal("block size 0 keyed blocks")
	}
	if got := (&Request{Tokens: []uint32{1}}).AppendKeys(nil, "m", 0); len(got) != 0 {
		t.Fatal("block size 0 keyed blocks")
	}
}

// TestAppendKeysAllocations: keying into a dst with room allocates nothing
// for plain and salted prompts (under the race detector, a constant few:
// never one per block).
func TestAppendKeysAllocations(t *testing.T) {
	tokens := randTokens(rand.New(rand.NewPCG(11, 12)), 32768)
	dst := make([]Key, 0, 2048)
	for _, salt := range []string{"", "tenant"} {
		r := Request{Tokens: tokens, CacheSalt: salt}
		allocs := testing.AllocsPerRun(20, func() { dst = r.AppendKeys(dst[:0], "model", 16) })
		limit := 0.0
		if raceEnabled {
			limit = 2
		}
		if allocs > limit {
			t.Errorf("salt %q: %.0f allocations", salt, allocs)
		}
	}
}

func TestAppendTokensLittleEndian(t *testing.T) {
	tokens := []uint32{0, 1, 0x01020304, 0xffffffff}
	want := []byte{0, 0, 0, 0, 1, 0, 0, 0, 4, 3, 2, 1, 0xff, 0xff, 0xff, 0xff}
	if got := appendTokens([]byte{9}, tokens); string(got) != string(append([]byte{9}, want...)) {
		t.Fatalf("appendTokens = %x", got)
	}
	if got := appendTokens(nil, nil); len(got) != 0 {
		t.Fatal("empty tokens")
	}
}

// FuzzKeys: for any tokens, salt and split point, keying in two chained runs
// equals keying at once, and the salted and unsalted chains are disjoint.
func FuzzKeys(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef"), "tenant", uint8(16), uint16(1))
	f.Fuzz(func(t *testing.T, raw []byte, salt string, bs uint8, split uint16) {
		if bs == 0 {
			bs = 1
		}
		tokens := make([]uint32, len(raw))
		for i, b := range raw {
			tokens[i] = uint32(b) * 977
		}
		r := Request{Tokens: tokens, CacheSalt: salt}
		all := r.AppendKeys(nil, "m", int(bs))
		n := len(tokens) / int(bs)
		s := int(split) % (n + 1)
		extras := make([][]Extra, n)
		for i := range extras {
			extras[i] = r.BlockExtras(nil, i, int(bs))
		}
		got := AppendChain(nil, Root("m", ""), int(bs), tokens[:s*int(bs)], extras[:s])
		parent := Root("m", "")
		if s > 0 {
			parent = got[s-1]
		}
		got = AppendChain(got, parent, int(bs), tokens[s*int(bs):], extras[s:])
		if fmt.Sprint(got) != fmt.Sprint(all) {
			t.Fatal("split chain differs")
		}
		if salt != "" {
			plain := (&Request{Tokens: tokens}).AppendKeys(nil, "m", int(bs))
			for i := range plain {
				if plain[i] == all[i] {
					t.Fatalf("salted block %d equals unsalted", i)
				}
			}
		}
	})
}
