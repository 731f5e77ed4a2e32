package e2e

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/testnet"
	"github.com/kvroute/kvroute/test/vectors"
)

func socket(t *testing.T, ctx *zmq.Context, typ zmq.Type) *zmq.Socket {
	t.Helper()
	s, err := ctx.NewSocket(typ)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRcvtimeo(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

// bindFree binds s to a free loopback port and returns the endpoint.
func bindFree(t *testing.T, s *zmq.Socket) string {
	t.Helper()
	if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, err := s.GetLastEndpoint()
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

func newContext(t *testing.T) *zmq.Context {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Term() })
	return ctx
}

// TestZMQLiveFrames publishes the vector batches as vLLM does (PUB, frames
// [topic, seq, payload]) through libzmq and reads them back with a SUB
// filtered by topic.
func TestZMQLiveFrames(t *testing.T) {
	batches, topic, _, err := vectors.EventBatches()
	if err != nil {
		t.Fatal(err)
	}
	ctx := newContext(t)
	pub := socket(t, ctx, zmq.PUB)
	ep := bindFree(t, pub)
	sub := socket(t, ctx, zmq.SUB)
	if err := sub.SetSubscribe(topic); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(ep); err != nil {
		t.Fatal(err)
	}
	// PUB drops messages until the subscription arrives: publish a probe on
	// the topic until one gets through (bounded).
	if err := sub.SetRcvtimeo(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, 5*time.Second, 10*time.Millisecond, func() error {
		probe := kvevents.Message{Topic: []byte(topic), Seq: kvevents.EndSeq - 1, Payload: []byte{0x92, 0x00, 0x90}}
		if _, err := pub.SendMessage(probe.Frames()); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.RecvMessageBytes(0); err != nil {
			return fmt.Errorf("the subscription is not live: %w", err)
		}
		return nil
	})
	if err := sub.SetRcvtimeo(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	// A message on another topic is filtered out by the SUB.
	other := kvevents.Message{Topic: []byte("other"), Seq: 99, Payload: batches[0].Payload}
	if _, err := pub.SendMessage(other.Frames()); err != nil {
		t.Fatal(err)
	}
	for i, b := range batches {
		m := kvevents.Message{Topic: []byte(topic), Seq: uint64(i), Payload: b.Payload}
		if _, err := pub.SendMessage(m.Frames()); err != nil {
			t.Fatal(err)
		}
	}
	for i, b := range batches {
		frames, err := sub.RecvMessageBytes(0)
		if err != nil {
			t.Fatal(err)
		}
		m, err := kvevents.ParseMessage(frames)
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Topic) != topic || m.Seq != uint64(i) || !bytes.Equal(m.Payload, b.Payload) {
			t.Fatalf("message %d: topic %q seq %d", i, m.Topic, m.Seq)
		}
		batch, err := kvevents.Decode(m.Payload)
		if err != nil || len(batch.Events) != 3 {
			t.Fatalf("message %d decodes to %+v, %v", i, batch, err)
		}
	}
}

// TestZMQReplay runs the replay exchange over libzmq: a DEALER asks a
// ROUTER for batches from a start seq, the ROUTER answers in either layout
// and ends with the end marker, and the DEALER parses both.
func TestZMQReplay(t *testing.T) {
	batches, topic, _, err := vectors.EventBatches()
	if err != nil {
		t.Fatal(err)
	}
	ctx := newContext(t)
	router := socket(t, ctx, zmq.ROUTER)
	ep := bindFree(t, router)
	dealer := socket(t, ctx, zmq.DEALER)
	if err := dealer.Connect(ep); err != nil {
		t.Fatal(err)
	}
	ring := map[uint64][]byte{5: batches[0].Payload, 6: batches[1].Payload, 7: batches[0].Payload}
	for _, layout := range []kvevents.ReplayLayout{kvevents.ReplayWithTopic, kvevents.ReplayLegacy} {
		if _, err := dealer.SendMessage(kvevents.ReplayRequest(6)); err != nil {
			t.Fatal(err)
		}
		req, err := router.RecvMessageBytes(0)
		if err != nil {
			t.Fatal(err)
		}
		id, start, err := kvevents.ParseReplayRequest(req)
		if err != nil || start != 6 {
			t.Fatalf("router got %q: start %d, %v", req, start, err)
		}
		for seq := start; seq <= 7; seq++ {
			reply := append([][]byte{id}, kvevents.ReplayReply(layout, []byte(topic), seq, ring[seq])...)
			if _, err := router.SendMessage(reply); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := router.SendMessage(append([][]byte{id}, kvevents.ReplayEnd(layout)...)); err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for n := 0; n < 10; n++ {
			frames, err := dealer.RecvMessageBytes(0)
			if err != nil {
				t.Fatal(err)
			}
			f, err := kvevents.ParseReplayReply(frames)
			if err != nil {
				t.Fatalf("%v: %v", layout, err)
			}
			if f.Layout != layout {
				t.Fatalf("parsed layout %v, sent %v", f.Layout, layout)
			}
			if f.End {
				break
			}
			if !bytes.Equal(f.Payload, ring[f.Seq]) {
				t.Fatalf("seq %d payload differs", f.Seq)
			}
			if _, err := kvevents.Decode(f.Payload); err != nil {
				t.Fatal(err)
			}
			got = append(got, f.Seq)
		}
		if len(got) != 2 || got[0] != 6 || got[1] != 7 {
			t.Fatalf("%v: replayed %v, want [6 7]", layout, got)
		}
	}
}
