package picker

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestUnionModels: a card per id, the first list's that names it, in the
// lists' order; cards without an id are dropped.
func TestUnionModels(t *testing.T) {
	card := func(id, root string) modelCard {
		raw, _ := json.Marshal(map[string]string{"id": id, "root": root})
		return modelCard{id: id, raw: raw}
	}
	for _, tc := range []struct {
		name  string
		lists [][]modelCard
		want  []string // id@root
	}{
		{"nothing", nil, nil},
		{"one list as it is", [][]modelCard{{card("a", "1"), card("lora", "1")}}, []string{"a@1", "lora@1"}},
		{"a model served by several groups appears once, as the first list has it",
			[][]modelCard{{card("base", "big")}, {card("base", "small"), card("other", "small")}}, []string{"base@big", "other@small"}},
		{"adapters of several engines of a group are all there",
			[][]modelCard{{card("base", "x"), card("sql", "x")}, {card("base", "y")}, {card("base", "z"), card("chat", "z")}},
			[]string{"base@x", "sql@x", "chat@z"}},
		{"a card without an id is dropped", [][]modelCard{{card("", "x"), card("a", "x")}}, []string{"a@x"}},
		{"duplicates within one list", [][]modelCard{{card("a", "1"), card("a", "2")}}, []string{"a@1"}},
	} {
		var got []string
		for _, c := range unionModels(tc.lists) {
			var v struct{ ID, Root string }
			if err := json.Unmarshal(c.raw, &v); err != nil || v.ID != c.id {
				t.Fatalf("%s: card %s for id %q", tc.name, c.raw, c.id)
			}
			got = append(got, v.ID+"@"+v.Root)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestParseModelList: an engine's list, each card kept as written.
func TestParseModelList(t *testing.T) {
	got, err := parseModelList([]byte(`{"object":"list","data":[{"id":"m","object":"model","max_model_len":8192,"permission":[{"id":"modelperm-1"}]},{"id":"a","parent":"m"},7]}`))
	if err != nil || len(got) != 2 || got[0].id != "m" || got[1].id != "a" || string(got[1].raw) != `{"id":"a","parent":"m"}` {
		t.Fatalf("%+v %v", got, err)
	}
	for _, bad := range []string{``, `[]`, `{"data":{}}`, `{"data":[`} {
		if _, err := parseModelList([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
