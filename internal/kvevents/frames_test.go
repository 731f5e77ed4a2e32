package kvevents

import (
	"bytes"
	"errors"
	"testing"
)

func TestSeq(t *testing.T) {
	b := SeqBytes(0x0102030405060708)
	if !bytes.Equal(b, []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("SeqBytes = %x", b)
	}
	if v, err := ParseSeq(b); err != nil || v != 0x0102030405060708 {
		t.Fatalf("ParseSeq = %x, %v", v, err)
	}
	for _, bad := range [][]byte{nil, {1}, make([]byte, 9)} {
		if _, err := ParseSeq(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseSeq(%x) = %v", bad, err)
		}
	}
	if !bytes.Equal(SeqBytes(EndSeq), bytes.Repeat([]byte{0xff}, 8)) {
		t.Error("EndSeq is not ff×8")
	}
}

func TestParseMessage(t *testing.T) {
	for _, bad := range [][][]byte{
		nil,
		{[]byte("t"), SeqBytes(1)},
		{[]byte("t"), {1, 2}, []byte("p")},
		{[]byte("t"), SeqBytes(1), []byte("p"), []byte("x")},
	} {
		if _, err := ParseMessage(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseMessage(%q) = %v", bad, err)
		}
	}
	// An empty topic is a valid (empty) first frame.
	m, err := ParseMessage([][]byte{{}, SeqBytes(5), []byte("p")})
	if err != nil || len(m.Topic) != 0 || m.Seq != 5 {
		t.Fatalf("empty topic: %+v, %v", m, err)
	}
}

func TestReplayRequest(t *testing.T) {
	req := ReplayRequest(42)
	if len(req) != 2 || len(req[0]) != 0 || !bytes.Equal(req[1], SeqBytes(42)) {
		t.Fatalf("ReplayRequest = %q", req)
	}
	id, start, err := ParseReplayRequest(append([][]byte{[]byte("peer")}, req...))
	if err != nil || string(id) != "peer" || start != 42 {
		t.Fatalf("ParseReplayRequest = %q %d %v", id, start, err)
	}
	for _, bad := range [][][]byte{
		{[]byte("peer"), SeqBytes(1)},                     // REQ-style, no delimiter
		{[]byte("peer"), {}, SeqBytes(1), []byte("more")}, // extra frame
	} {
		if _, _, err := ParseReplayRequest(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseReplayRequest(%q) = %v", bad, err)
		}
	}
	// As vLLM: the delimiter's content is ignored, and start_seq is a
	// big-endian integer of any length.
	for _, c := range []struct {
		seq  []byte
		want uint64
	}{{[]byte{1}, 1}, {[]byte{1, 0}, 256}, {nil, 0}, {append([]byte{0, 0}, SeqBytes(7)...), 7}, {append([]byte{1}, SeqBytes(7)...), EndSeq}} {
		_, got, err := ParseReplayRequest([][]byte{[]byte("peer"), []byte("x"), c.seq})
		if err != nil || got != c.want {
			t.Errorf("start_seq %x: %d, %v; want %d", c.seq, got, err, c.want)
		}
	}
}

func TestReplayReplies(t *testing.T) {
	topic, payload := []byte("kv@pod@m"), []byte{0x93}
	cur := ReplayReply(ReplayWithTopic, topic, 7, payload)
	if len(cur) != 4 || len(cur[0]) != 0 || !bytes.Equal(cur[1], topic) || !bytes.Equal(cur[2], SeqBytes(7)) {
		t.Fatalf("current layout = %q", cur)
	}
	leg := ReplayReply(ReplayLegacy, topic, 7, payload)
	if len(leg) != 3 || len(leg[0]) != 0 || !bytes.Equal(leg[1], SeqBytes(7)) {
		t.Fatalf("legacy layout = %q", leg)
	}
	for _, c := range []struct {
		frames [][]byte
		layout ReplayLayout
	}{{cur, ReplayWithTopic}, {leg, ReplayLegacy}} {
		f, err := ParseReplayReply(c.frames)
		if err != nil || f.Layout != c.layout || f.End || f.Seq != 7 || !bytes.Equal(f.Payload, payload) {
			t.Fatalf("ParseReplayReply(%q) = %+v, %v", c.frames, f, err)
		}
		if c.layout == ReplayWithTopic && !bytes.Equal(f.Topic, topic) {
			t.Errorf("topic = %q", f.Topic)
		}
	}
	// End markers exactly as vLLM sends them.
	endCur := [][]byte{{}, {}, bytes.Repeat([]byte{0xff}, 8), {}}
	endLeg := [][]byte{{}, bytes.Repeat([]byte{0xff}, 8), {}}
	for layout, want := range map[ReplayLayout][][]byte{ReplayWithTopic: endCur, ReplayLegacy: endLeg} {
		got := ReplayEnd(layout)
		if len(got) != len(want) {
			t.Fatalf("%v end = %q", layout, got)
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("%v end = %q, want %q", layout, got, want)
			}
		}
		f, err := ParseReplayReply(want)
		if err != nil || !f.End || f.Layout != layout {
			t.Fatalf("end marker %v: %+v, %v", layout, f, err)
		}
	}
	for _, bad := range [][][]byte{
		nil,
		{{}, SeqBytes(1)},
		{[]byte("x"), SeqBytes(1), payload},
		{{}, []byte("t"), {1, 2, 3}, payload},
		{{}, []byte("t"), SeqBytes(1), payload, payload},
	} {
		if _, err := ParseReplayReply(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseReplayReply(%q) = %v", bad, err)
		}
	}
	for _, l := range []ReplayLayout{ReplayWithTopic, ReplayLegacy} {
		if got, err := ParseReplayLayout(l.String()); err != nil || got != l {
			t.Errorf("ParseReplayLayout(%q) = %v, %v", l, got, err)
		}
	}
	if _, err := ParseReplayLayout("v2"); err == nil {
		t.Error("ParseReplayLayout accepted v2")
	}
}
