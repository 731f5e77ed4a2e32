package p2p

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// FuzzFrame: any bytes are read and decoded without panicking, within the
// bounds; whatever decodes, re-encodes to a frame that decodes the same;
// whatever opens an inbound handshake is checked without panicking.
func FuzzFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"connect","version":1,"id":"h:1","fingerprint":{"block_size":16,"hash_seed":"s","hash_algo":"a","model":"m"}}`,
		`{"type":"lookup","seq":3,"kv_request_id":"r","hashes":"` + string(bytes.Repeat([]byte("A"), 44)) + `"}`,
		`{"type":"lookup_resp","seq":3,"hits":2,"active":1}`,
		`{"type":"transfer_done","seq":4,"success":true,"blocks":2}`,
		`{"type":"disconnect","reason":"x"}`,
		`{"type":"disconnect","version":1,"id":"x:1"}`,
		`{"type":"connect_ack","version":1,"id":"x:1"}`,
		`{"type":"fetch","hashes":""}`,
		`[]`, `{"type":1}`, `{"hits":1e99}`,
	} {
		f.Add(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s)
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, "")
	f.Fuzz(func(t *testing.T, head []byte, body string) {
		const maxFrame, maxHashes = 4096, 8
		b, err := readFrame(bytes.NewReader(append(head, body...)), maxFrame)
		if err != nil {
			return
		}
		if len(b) == 0 || len(b) > maxFrame {
			t.Fatalf("read a frame of %d bytes", len(b))
		}
		fr, err := decodeFrame(b, maxHashes)
		if err != nil {
			var fe *frameError
			if !errors.As(err, &fe) {
				t.Fatalf("a decode error of the wrong kind: %v", err)
			}
			return
		}
		if len(fr.Hashes)/digestSize > maxHashes || len(fr.Hashes)%digestSize != 0 {
			t.Fatalf("accepted %d hash bytes", len(fr.Hashes))
		}
		for _, want := range []string{typeConnect, typeConnectAck} {
			if handshakeFrame(fr, want) == nil && fr.Type != typeDisconnect {
				if fr.ID == "" || fr.Fingerprint == nil {
					t.Fatalf("a %s without id or fingerprint opens a handshake: %+v", fr.Type, fr)
				}
			}
		}
		if handshakeFrame(fr, typeConnect) == nil {
			if fr.Type != typeConnect {
				t.Fatalf("a %s opens an inbound handshake", fr.Type)
			}
			_ = acceptable(Fingerprint{BlockSize: 16}, fr) // must not panic
		}
		wire, err := encodeFrame(fr)
		if err != nil {
			t.Fatal(err)
		}
		again, err := readFrame(bytes.NewReader(wire), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		fr2, err := decodeFrame(again, maxHashes)
		if err != nil || !reflect.DeepEqual(fr, fr2) {
			t.Fatalf("round trip: %+v, %v; want %+v", fr2, err, fr)
		}
	})
}

// TestHashesRoundTrip: digests pack and unpack.
func TestHashesRoundTrip(t *testing.T) {
	hs := make([]blockkey.Digest, 3)
	for i := range hs {
		hs[i][0], hs[i][31] = byte(i), byte(10+i)
	}
	got := unpackHashes(packHashes(hs))
	if !reflect.DeepEqual(got, hs) {
		t.Fatalf("%v", got)
	}
}
