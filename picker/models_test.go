package picker

import (
	"maps"
	"testing"

	"github.com/kvroute/kvroute/picker/fleet"
)

func TestBuildModels(t *testing.T) {
	ep := func(group, url, model string) fleet.Endpoint {
		return fleet.Endpoint{URL: url, Group: group, Info: fleet.Identity{Endpoint: url, Model: model}}
	}
	parent := "base"
	eps := []fleet.Endpoint{ep("small", "http://c", "base"), ep("big", "http://b", "base"), ep("big", "http://a", "base"), ep("other", "http://d", "other")}
	groups := groupsOf(eps)
	if len(groups) != 3 || groups[0].id != "big" || groups[0].endpoints[0].URL != "http://a" || groups[1].id != "other" || groups[2].id != "small" {
		t.Fatalf("groups: %+v", groups)
	}
	for _, tc := range []struct {
		name  string
		lists map[string][]modelEntry
		old   map[string]modelRef
		want  map[string]modelRef
	}{
		{"a name served by several groups goes to the largest",
			map[string][]modelEntry{"big": {{ID: "base"}}, "small": {{ID: "base"}}, "other": {{ID: "other"}}}, nil,
			map[string]modelRef{"base": {group: "big"}, "other": {group: "other"}}},
		{"an entry with a parent is an adapter",
			map[string][]modelEntry{"big": {{ID: "base"}, {ID: "sql-lora", Parent: &parent}}, "small": {}, "other": {}}, nil,
			map[string]modelRef{"base": {group: "big"}, "sql-lora": {group: "big", lora: "sql-lora"}, "other": {group: "other"}}},
		{"an empty parent is not an adapter",
			map[string][]modelEntry{"big": {{ID: "alias", Parent: new(string)}}, "small": {}, "other": {}}, nil,
			map[string]modelRef{"base": {group: "big"}, "alias": {group: "big"}, "other": {group: "other"}}},
		{"every group serves its base model without a list",
			map[string][]modelEntry{}, nil,
			map[string]modelRef{"base": {group: "big"}, "other": {group: "other"}}},
		{"a group whose list failed keeps what it served",
			map[string][]modelEntry{"big": {{ID: "base"}}, "small": {}},
			map[string]modelRef{"old-lora": {group: "other", lora: "old-lora"}, "gone": {group: "vanished"}},
			map[string]modelRef{"base": {group: "big"}, "other": {group: "other"}, "old-lora": {group: "other", lora: "old-lora"}}},
	} {
		if got := buildModels(groups, tc.lists, tc.old); !maps.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
