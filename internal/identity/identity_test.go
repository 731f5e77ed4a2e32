package identity

import "testing"

func TestID(t *testing.T) {
	base := Group{Model: "m", BlockSize: 16, KeyFormat: "k", SummaryParams: "p", TokenizerFingerprint: "f"}
	if again := (Group{Model: "m", BlockSize: 16, KeyFormat: "k", SummaryParams: "p", TokenizerFingerprint: "f"}); again.ID() != base.ID() || len(base.ID()) != 12 {
		t.Fatal("ID not stable")
	}
	seen := map[string]bool{base.ID(): true}
	for _, g := range []Group{
		{Model: "m2", BlockSize: 16, KeyFormat: "k", SummaryParams: "p", TokenizerFingerprint: "f"},
		{Model: "m", BlockSize: 32, KeyFormat: "k", SummaryParams: "p", TokenizerFingerprint: "f"},
		{Model: "m", BlockSize: 16, KeyFormat: "k2", SummaryParams: "p", TokenizerFingerprint: "f"},
		{Model: "m", BlockSize: 16, KeyFormat: "k", SummaryParams: "p2", TokenizerFingerprint: "f"},
		{Model: "m", BlockSize: 16, KeyFormat: "k", SummaryParams: "p", TokenizerFingerprint: "f2"},
		{Model: "m\x0016", BlockSize: 0, KeyFormat: "k", SummaryParams: "p", TokenizerFingerprint: "f"},
	} {
		if seen[g.ID()] {
			t.Fatalf("%+v shares an ID", g)
		}
		seen[g.ID()] = true
	}
}
