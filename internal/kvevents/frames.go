package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// EndSeq is the sequence number of the replay end marker:
// (-1).to_bytes(8, "big", signed=True) = ff ff ff ff ff ff ff ff.
const EndSeq uint64 = math.MaxUint64

// SeqBytes returns seq as the 8-byte big-endian frame vLLM sends.
func SeqBytes(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// ParseSeq reads an 8-byte big-endian sequence frame.
func ParseSeq(frame []byte) (uint64, error) {
	if len(frame) != 8 {
		return 0, fmt.Errorf("%w: sequence frame of %d bytes, want 8", ErrMalformed, len(frame))
	}
	return binary.BigEndian.Uint64(frame), nil
}

// Message is one live message from a vLLM PUB socket.
type Message struct {
	Topic   []byte
	Seq     uint64
	Payload []byte
}

// Frames returns the multipart message [topic, seq, payload].
func (m Message) Frames() [][]byte {
	return [][]byte{m.Topic, SeqBytes(m.Seq), m.Payload}
}

// ParseMessage parses a live PUB message [topic, seq, payload]. The
// returned slices alias frames.
func ParseMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("%w: message of %d frames, want [topic, seq, payload]", ErrMalformed, len(frames))
	}
	seq, err := ParseSeq(frames[1])
	if err != nil {
		return Message{}, err
	}
	return Message{Topic: frames[0], Seq: seq, Payload: frames[2]}, nil
}

// ReplayRequest returns the frames a DEALER sends to vLLM's replay ROUTER
// to ask for every buffered batch with seq ≥ start: [b"", start].
func ReplayRequest(start uint64) [][]byte {
	return [][]byte{{}, SeqBytes(start)}
}

// ParseReplayRequest parses a request as a ROUTER receives it:
// [identity, delimiter, start_seq]. Like vLLM it requires exactly three
// frames, ignores the delimiter's content, and reads start_seq as a
// big-endian integer of any length (a value past 64 bits asks for nothing
// but the end marker, so it reads as EndSeq).
func ParseReplayRequest(frames [][]byte) (identity []byte, start uint64, err error) {
	if len(frames) != 3 {
		return nil, 0, fmt.Errorf("%w: invalid replay request of %d frames, want [identity, \"\", start_seq]", ErrMalformed, len(frames))
	}
	for i, c := range frames[2] {
		if len(frames[2])-i > 8 {
			if c != 0 {
				return frames[0], EndSeq, nil
			}
			continue
		}
		start = start<<8 | uint64(c)
	}
	return frames[0], start, nil
}

// ReplayLayout is the shape of a replay reply.
type ReplayLayout uint8

const (
	// ReplayWithTopic: [b"", topic, seq, payload], end [b"", b"", END, b""]
	// (vLLM since PR #45177, June 2026).
	ReplayWithTopic ReplayLayout = iota
	// ReplayLegacy: [b"", seq, payload], end [b"", END, b""] (older vLLM).
	ReplayLegacy
)

// String returns "topic" or "legacy".
func (l ReplayLayout) String() string {
	if l == ReplayLegacy {
		return "legacy"
	}
	return "topic"
}

// ParseReplayLayout parses "topic" or "legacy".
func ParseReplayLayout(s string) (ReplayLayout, error) {
	switch s {
	case "topic":
		return ReplayWithTopic, nil
	case "legacy":
		return ReplayLegacy, nil
	}
	return 0, fmt.Errorf("kvevents: unknown replay layout %q (want topic or legacy)", s)
}

// ReplayReply returns one reply as a DEALER receives it (a ROUTER sends it
// with the requester's identity in front).
func ReplayReply(layout ReplayLayout, topic []byte, seq uint64, payload []byte) [][]byte {
	if layout == ReplayLegacy {
		return [][]byte{{}, SeqBytes(seq), payload}
	}
	return [][]byte{{}, topic, SeqBytes(seq), payload}
}

// ReplayEnd returns the end marker as a DEALER receives it.
func ReplayEnd(layout ReplayLayout) [][]byte {
	return ReplayReply(layout, []byte{}, EndSeq, []byte{})
}

// ReplayFrame is one parsed replay reply.
type ReplayFrame struct {
	Layout  ReplayLayout
	End     bool   // the end marker: no more replies for this request
	Topic   []byte // nil in the legacy layout
	Seq     uint64
	Payload []byte
}

// ParseReplayReply parses a reply as a DEALER receives it, telling the two
// layouts apart by frame count (4 or 3 frames, the first empty).
func ParseReplayReply(frames [][]byte) (ReplayFrame, error) {
	var f ReplayFrame
	switch {
	case len(frames) == 4 && len(frames[0]) == 0:
		f.Layout, f.Topic = ReplayWithTopic, frames[1]
		frames = frames[2:]
	case len(frames) == 3 && len(frames[0]) == 0:
		f.Layout = ReplayLegacy
		frames = frames[1:]
	default:
		return ReplayFrame{}, fmt.Errorf("%w: replay reply of %d frames, want [\"\", topic, seq, payload] or [\"\", seq, payload]", ErrMalformed, len(frames))
	}
	seq, err := ParseSeq(frames[0])
	if err != nil {
		return ReplayFrame{}, err
	}
	f.Seq, f.Payload, f.End = seq, frames[1], seq == EndSeq
	return f, nil
}
