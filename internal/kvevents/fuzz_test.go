package kvevents

import (
	"bytes"
	"testing"

	"github.com/kvroute/kvroute/test/vectors"
)

// FuzzDecode: any input decodes to a batch or an error, never a panic; a
// decoded batch re-encodes in its layout, and that encoding is a fixed point
// (decode → encode gives the same bytes again).
func FuzzDecode(f *testing.F) {
	batches, _, _, err := vectors.EventBatches()
	if err != nil {
		f.Fatal(err)
	}
	for _, b := range batches {
		f.Add(b.Payload)
	}
	for _, layout := range []Layout{LayoutMap, LayoutArray} {
		ev := storedEvent(2, 4, true)
		ev.ExtraKeys = [][]any{{"Alice", "salt"}, {"Alice", []any{"mm", int64(3)}}}
		p, err := Encode(&Batch{TS: 1, Events: []Event{ev, {Type: TypeAllBlocksCleared}}, DataParallelRank: Some(1)}, layout)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var d Decoder
		var b Batch
		if err := d.Decode(p, &b); err != nil {
			return
		}
		for _, ev := range b.Events {
			_ = ev.Validate()
			if ev.Type == TypeUnknown {
				return
			}
		}
		once, err := Encode(&b, b.Layout)
		if err != nil {
			t.Fatalf("decoded batch does not encode: %v", err)
		}
		again, err := Decode(once)
		if err != nil {
			t.Fatalf("re-encoded batch does not decode: %v\n%x", err, once)
		}
		twice, err := Encode(again, again.Layout)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(once, twice) {
			t.Fatalf("encoding is not a fixed point:\n%x\n%x", once, twice)
		}
	})
}

// FuzzFrames: the frame parsers never panic and accept only well-formed
// frame lists. The input is split into frames at 0xff bytes.
func FuzzFrames(f *testing.F) {
	f.Add([]byte("kv@pod@model\xff\x00\x00\x00\x00\x00\x00\x00\x01\xffpayload"))
	f.Add([]byte("\xff\x00\x00\x00\x00\x00\x00\x00\x07"))
	f.Fuzz(func(t *testing.T, p []byte) {
		frames := bytes.Split(p, []byte{0xff})
		if m, err := ParseMessage(frames); err == nil {
			if back, err := ParseMessage(m.Frames()); err != nil || back.Seq != m.Seq {
				t.Fatalf("message does not round-trip: %v", err)
			}
		}
		if id, start, err := ParseReplayRequest(frames); err == nil {
			req := append([][]byte{id}, ReplayRequest(start)...)
			if _, again, err := ParseReplayRequest(req); err != nil || (again != start && start != EndSeq) {
				t.Fatalf("replay request does not round-trip: %v", err)
			}
		}
		if rf, err := ParseReplayReply(frames); err == nil {
			var back ReplayFrame
			if rf.End {
				back, err = ParseReplayReply(ReplayEnd(rf.Layout))
			} else {
				back, err = ParseReplayReply(ReplayReply(rf.Layout, rf.Topic, rf.Seq, rf.Payload))
			}
			if err != nil || back.Seq != rf.Seq || back.Layout != rf.Layout || back.End != rf.End {
				t.Fatalf("replay reply does not round-trip: %+v vs %+v (%v)", rf, back, err)
			}
		}
	})
}
