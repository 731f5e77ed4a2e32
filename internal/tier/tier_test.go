package tier

import "testing"

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		tier Tier
		name string
	}{{GPU, "GPU"}, {CPU, "CPU"}, {Storage, "STORAGE"}} {
		if got := tc.tier.String(); got != tc.name {
			t.Errorf("%d.String() = %q, want %q", tc.tier, got, tc.name)
		}
		if got, ok := Parse(tc.name); !ok || got != tc.tier {
			t.Errorf("Parse(%q) = %v, %v", tc.name, got, ok)
		}
		if !tc.tier.Valid() {
			t.Errorf("%v not valid", tc.tier)
		}
	}
	for _, bad := range []string{"", "gpu", "FS", "DISK"} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	if Tier(Count).Valid() || Tier(Count).String() != "UNKNOWN" {
		t.Error("an out-of-range tier passes as valid")
	}
}

func TestFromMedium(t *testing.T) {
	for _, tc := range []struct {
		medium string
		tier   Tier
		ok     bool
	}{{"", GPU, true}, {"GPU", GPU, true}, {"CPU", CPU, true}, {"STORAGE", Storage, true}, {"FS", Storage, true},
		{"OBJ", Storage, true}, {"gpu", 0, false}, {"NVME", 0, false}} {
		got, ok := FromMedium(tc.medium)
		if ok != tc.ok || (ok && got != tc.tier) {
			t.Errorf("FromMedium(%q) = %v, %v; want %v, %v", tc.medium, got, ok, tc.tier, tc.ok)
		}
	}
}
