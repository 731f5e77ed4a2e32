package render

import (
	"encoding/json"
	"testing"
)

// TestMMItems: vLLM's multimodal features — per-modality maps or plain
// lists — become items sorted by offset; mismatched or out-of-range
// placeholders are refused.
func TestMMItems(t *testing.T) {
	items, err := mmItems(json.RawMessage(`{"image":["h2","h1"],"audio":["a1"]}`),
		json.RawMessage(`{"image":[{"offset":40,"length":10},{"offset":5,"length":10}],"audio":[{"offset":20,"length":4}]}`), 64)
	if err != nil || len(items) != 3 || items[0].Identifier != "h1" || items[1].Identifier != "a1" || items[2].Offset != 40 {
		t.Fatalf("%+v %v", items, err)
	}
	items, err = mmItems(json.RawMessage(`["x"]`), json.RawMessage(`[{"offset":0,"length":3}]`), 3)
	if err != nil || len(items) != 1 || items[0].Length != 3 {
		t.Fatalf("list form: %+v %v", items, err)
	}
	for _, bad := range [][2]string{
		{`{"image":["h"]}`, `{"image":[]}`},
		{`["x"]`, `[{"offset":2,"length":3}]`},
		{`["x"]`, `[{"offset":-1,"length":1}]`},
		{`5`, `[]`},
	} {
		if _, err := mmItems(json.RawMessage(bad[0]), json.RawMessage(bad[1]), 4); err == nil {
			t.Errorf("%s / %s accepted", bad[0], bad[1])
		}
	}
	if items, err := mmItems(nil, nil, 4); err != nil || items != nil {
		t.Fatal("no features")
	}
}

func TestHasMedia(t *testing.T) {
	for body, want := range map[string]bool{
		`{"messages":[{"role":"user","content":"plain"}]}`:                                                          false,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`:                                     false,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}}]}]}`: true,
		`{"prompt":"x"}`: false,
	} {
		if got := hasMedia([]byte(body)); got != want {
			t.Errorf("%s: %v", body, got)
		}
	}
}
