package vectors

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCopiesMatchShared checks that the embedded copies are byte-identical
// to the shared vllm-vectors folder beside the repository.
func TestCopiesMatchShared(t *testing.T) {
	shared := filepath.Join("..", "..", "..", "shared", "vllm-vectors")
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 5 {
		t.Fatalf("testdata has %d files, want the 4 vector files and README.md", len(entries))
	}
	for _, e := range entries {
		mine, err := os.ReadFile(filepath.Join("testdata", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := os.ReadFile(filepath.Join(shared, e.Name()))
		if err != nil {
			t.Fatalf("shared vectors not found beside the repository: %v", err)
		}
		if !bytes.Equal(mine, theirs) {
			t.Errorf("testdata/%s differs from the shared copy", e.Name())
		}
	}
}

func TestLoaders(t *testing.T) {
	for _, f := range []func() (*Capture, error){Base, LoRA} {
		c, err := f()
		if err != nil {
			t.Fatal(err)
		}
		if len(c.TokenIDs) != 400 || len(c.BlockHashes) != 25 || c.BlockSize != 16 || c.HashSeed != "42" {
			t.Fatalf("capture: %d tokens, %d hashes, block %d, seed %q", len(c.TokenIDs), len(c.BlockHashes), c.BlockSize, c.HashSeed)
		}
	}
	d, err := DerivedHashes()
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Cases) == 0 {
		t.Fatal("no derived cases")
	}
	b, topic, seq, err := EventBatches()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 2 || topic == "" || len(seq) != 8 {
		t.Fatalf("batches %d topic %q seq %x", len(b), topic, seq)
	}
}
