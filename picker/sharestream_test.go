package picker_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/verify"
	"github.com/kvroute/kvroute/picker"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestPickersShareBookings: real pickers follow each other's bookings
// over their --peer-listen ports, listed (static), under mutual TLS, and
// found through gossip. One test of real servers, its cases below.
func TestPickersShareBookings(t *testing.T) {
	t.Run("static", sharedStatic)
	t.Run("mutual TLS", sharedMutualTLS)
	t.Run("gossip", sharedByGossip)
}

// sharingPicker starts a picker over pod serving its bookings on
// peerAddr and following those of the pickers at peers.
func sharingPicker(t *testing.T, pod *testpod.Pod, peerAddr string, peers []string, adjust func(*picker.ServerConfig)) (*picker.Server, *prometheus.Registry) {
	t.Helper()
	s, _, reg := startObserved(t, pod, func(cfg *picker.ServerConfig) {
		cfg.PeerListen, cfg.PeerPickers = peerAddr, peers
		if adjust != nil {
			adjust(cfg)
		}
	})
	return s, reg
}

// pickersOf is what s's /debug/endpoints says of the bookings it shares,
// by the other picker's address.
func pickersOf(t *testing.T, s *picker.Server) (debugapi.Picker, map[string]debugapi.PeerPicker) {
	t.Helper()
	resp, err := http.Get("http://" + s.AdminAddr() + debugapi.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc debugapi.Document
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]debugapi.PeerPicker{}
	for _, p := range doc.Picker.Pickers {
		out[p.Address] = p
	}
	return doc.Picker, out
}

// following waits until s follows every address of want and names its
// own address (self) as itself.
func following(t *testing.T, s *picker.Server, self string, want ...string) {
	t.Helper()
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		me, peers := pickersOf(t, s)
		if !me.SharesBookings || me.Instance == "" {
			return fmt.Errorf("shares %v, instance %q", me.SharesBookings, me.Instance)
		}
		if self != "" && peers[self].State != debugapi.PeerSelf {
			return fmt.Errorf("its own address: %+v", peers[self])
		}
		for _, a := range want {
			if p := peers[a]; p.State != debugapi.PeerFollowing || p.LastBatchSeconds == nil {
				return fmt.Errorf("%s: %+v", a, p)
			}
		}
		return nil
	})
}

// sharedStatic: two pickers listing both addresses (each its
// own too) follow each other's bookings over their --peer-listen ports: a
// decision-API pick and a proxied request on one are held by the other
// (added, then released when the answer ends), counted sent and
// received. When one stops, the other says so: /debug/endpoints shows
// the stream failing, and verify's "pickers agree" fails naming it.
func sharedStatic(t *testing.T) {
	pod := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond})
	ga, gb := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	a, ra := sharingPicker(t, pod, ga, []string{ga, gb}, nil)
	b, rb := sharingPicker(t, pod, gb, []string{ga, gb}, nil)
	following(t, a, ga, gb)
	following(t, b, gb, ga)

	base := "http://" + a.Addr()
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error { // the endpoint routable
		resp, err := http.Post(base+"/routing/v1/pick", "application/json", strings.NewReader(chatBody("s", "hello")))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			raw, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("%d %s", resp.StatusCode, raw)
		}
		return nil
	})
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("s", "hello again")))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("proxied: %d", resp.StatusCode)
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		st := b.Router().PickerBookings()[ga]
		// The pick and the proxied request; the latter ended, so it awaits
		// nothing (the decision API's pick counts until a report covers it).
		if st.Added < 2 || st.Awaiting != 0 {
			return fmt.Errorf("b holds of a: %+v", st)
		}
		if sent, _ := series(t, ra, "kvroute_picker_bookings_sent_total", nil); sent < 4 { // add, first byte, first token, done, and the pick's add
			return fmt.Errorf("a sent %v changes", sent)
		}
		if got, _ := series(t, rb, "kvroute_picker_bookings_received_total", nil); got < 4 {
			return fmt.Errorf("b received %v changes", got)
		}
		return nil
	})
	if n, _ := series(t, rb, "kvroute_picker_pickers_following", nil); n != 1 {
		t.Errorf("b follows %v pickers, want 1", n)
	}
	if _, peers := pickersOf(t, b); peers[ga].Received < 4 || peers[ga].Instance == "" {
		t.Errorf("b's /debug/endpoints of a: %+v", peers[ga])
	}

	a.Close()
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		me, peers := pickersOf(t, b)
		if p := peers[ga]; p.State != debugapi.PeerConnecting || p.Error == "" {
			return fmt.Errorf("a, stopped: %+v", p)
		}
		checks := verify.JudgePicker(verify.PickerFacts{PublicAdminStatus: 404, SharesBookings: me.SharesBookings, Pickers: me.Pickers})
		for _, c := range checks {
			if c.Name == "pickers agree" {
				if c.OK || !strings.Contains(c.Detail, ga) {
					return fmt.Errorf("verify: %+v", c)
				}
				return nil
			}
		}
		return fmt.Errorf("no pickers agree check in %+v", checks)
	})
	if n, _ := series(t, rb, "kvroute_picker_pickers_following", nil); n != 0 {
		t.Errorf("b follows %v pickers after a stopped, want 0", n)
	}
	// a stopping is not b falling behind: its stream ends as unavailable.
	if n, _ := series(t, rb, "kvroute_picker_picker_streams_total", map[string]string{"cause": "behind"}); n != 0 {
		t.Errorf("b counted %v streams cut for falling behind when a stopped", n)
	}
	if _, peers := pickersOf(t, b); strings.Contains(peers[ga].Error, "fell behind") {
		t.Errorf("b says of a, stopped: %q", peers[ga].Error)
	}
}

// sharedMutualTLS: pickers serving their bookings with
// mutual TLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca) follow each
// other with their own certificates. A picker in plaintext, or with a
// certificate of another CA, cannot follow them, and says so.
func sharedMutualTLS(t *testing.T) {
	pod := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond})
	ca, other := testnet.NewCA(t, "kvroute-ca"), testnet.NewCA(t, "other-ca")
	files := func(c *testnet.CA, name string) testnet.Files {
		f := testnet.NewFiles(t)
		f.Write(t, c.Peer(t, name), c)
		return f
	}
	mtls := func(f testnet.Files) func(*picker.ServerConfig) {
		return func(cfg *picker.ServerConfig) { cfg.PeerTLSCert, cfg.PeerTLSKey, cfg.PeerTLSCA = f.Cert, f.Key, f.CA }
	}
	ga, gb := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	a, _ := sharingPicker(t, pod, ga, []string{gb}, mtls(files(ca, "picker-a")))
	b, _ := sharingPicker(t, pod, gb, []string{ga}, mtls(files(ca, "picker-b")))
	following(t, a, "", gb)
	following(t, b, "", ga)

	for name, adjust := range map[string]func(*picker.ServerConfig){
		"plaintext":  nil,
		"another CA": mtls(files(other, "picker-x")),
	} {
		x, _ := sharingPicker(t, pod, fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), []string{ga}, adjust)
		testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
			if _, peers := pickersOf(t, x); peers[ga].State != debugapi.PeerConnecting || peers[ga].Error == "" {
				return fmt.Errorf("%s: %+v", name, peers[ga])
			}
			return nil
		})
		if st := x.Router().PickerBookings()[ga]; st.Added != 0 || st.Applied != 0 {
			t.Errorf("%s: x got a's bookings: %+v", name, st)
		}
	}
}

// TestShareConfig: the settings of the bookings streams that cannot work
// are refused at start, saying why.
func TestShareConfig(t *testing.T) {
	for _, tc := range []struct {
		name, says string
		adjust     func(*picker.ServerConfig)
	}{
		{"peers without a port", "--peer-pickers without --peer-listen", func(c *picker.ServerConfig) { c.PeerListen, c.PeerPickers = "", []string{"127.0.0.1:9001"} }},
		{"a peer not host:port", "want host:port", func(c *picker.ServerConfig) { c.PeerPickers = []string{"picker-b"} }},
		{"TLS without a CA", "go together", func(c *picker.ServerConfig) { c.PeerTLSCert, c.PeerTLSKey = "cert.pem", "key.pem" }},
		{"a CA without a certificate", "go together", func(c *picker.ServerConfig) { c.PeerTLSCA = "ca.pem" }},
		{"a server name without a CA", "--peer-tls-server-name needs --peer-tls-ca", func(c *picker.ServerConfig) { c.PeerTLSServerName = "kvroute-picker" }},
		{"flush too long", "--bookings-flush", func(c *picker.ServerConfig) { c.BookingsFlush = time.Minute }},
		{"lifetime zero", "--peer-booking-lifetime", func(c *picker.ServerConfig) { c.Router.PeerBookingLifetime = 0 }},
	} {
		cfg := picker.DefaultServerConfig()
		cfg.Sidecars = []string{"127.0.0.1:1"}
		tc.adjust(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want it to say %q", tc.name, err, tc.says)
		}
	}
}

// sharedByGossip: two pickers with gossip and the
// default --peer-listen (a free port on loopback) find each other
// through their gossip metadata and follow each other's bookings, with
// no address given; a picker that leaves is no longer followed.
func sharedByGossip(t *testing.T) {
	pod := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond})
	start := func(name string, join ...string) *picker.Server {
		s, _, _ := startObserved(t, pod, func(cfg *picker.ServerConfig) {
			g := gossip.LocalConfig(name)
			g.Join = join
			cfg.Gossip, cfg.PeerListen = &g, picker.DefaultServerConfig().PeerListen
		})
		return s
	}
	a := start("picker-a")
	b := start("picker-b", a.Members().LocalAddr())
	following(t, a, "", b.PeerAddr())
	following(t, b, "", a.PeerAddr())
	b.Close()
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		if _, peers := pickersOf(t, a); len(peers) != 0 {
			return fmt.Errorf("a still lists %+v", peers)
		}
		return nil
	})
}
