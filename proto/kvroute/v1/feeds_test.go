package kvroutev1

import (
	"fmt"
	"testing"
)

func TestFeedsResolve(t *testing.T) {
	var f Feeds
	full := &SummaryUpdate{Endpoint: "http://a", Tier: "GPU", Epoch: 7, Feed: 1}
	if err := f.Resolve(full); err != nil {
		t.Fatal(err)
	}
	compact := &SummaryUpdate{Feed: 1, Body: &SummaryUpdate_Delta{Delta: &Delta{Seq: 2}}}
	if err := f.Resolve(compact); err != nil || compact.Endpoint != "http://a" || compact.Tier != "GPU" || compact.Epoch != 7 {
		t.Fatalf("compact update resolved to %q %q %d, %v", compact.Endpoint, compact.Tier, compact.Epoch, err)
	}
	// A new epoch comes in full and rebinds the number.
	if err := f.Resolve(&SummaryUpdate{Endpoint: "http://a", Tier: "GPU", Epoch: 8, Feed: 1}); err != nil {
		t.Fatal(err)
	}
	again := &SummaryUpdate{Feed: 1}
	if err := f.Resolve(again); err != nil || again.Epoch != 8 {
		t.Fatalf("after the new epoch: %d, %v", again.Epoch, err)
	}
	// Updates without a number (load reports, older sidecars) pass as they are.
	load := &SummaryUpdate{Endpoint: "http://b", Epoch: 3}
	if err := f.Resolve(load); err != nil || load.Endpoint != "http://b" {
		t.Fatal(err)
	}
	if err := f.Resolve(&SummaryUpdate{Feed: 9}); err == nil {
		t.Fatal("an unannounced feed number resolved")
	}
	var many Feeds
	for i := 1; i <= MaxFeeds; i++ {
		if err := many.Resolve(&SummaryUpdate{Endpoint: fmt.Sprint("e", i), Tier: "GPU", Feed: uint32(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := many.Resolve(&SummaryUpdate{Endpoint: "x", Tier: "GPU", Feed: MaxFeeds + 1}); err == nil {
		t.Fatal("more than MaxFeeds feeds accepted")
	}
	if err := many.Resolve(&SummaryUpdate{Endpoint: "e1", Tier: "CPU", Feed: 1}); err != nil {
		t.Fatalf("re-announcing a known number at the bound: %v", err)
	}
}
