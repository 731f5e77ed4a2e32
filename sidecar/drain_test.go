package sidecar_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/sidecar"
	"github.com/kvroute/kvroute/test/metrictest"
)

// TestDrain: Drain reaches a watching picker at once as a load report
// with draining set, every later report carries it, /readyz fails with
// the reason, /debug/state and the gauge show it, and Drain returns as
// soon as no picker watches, long before its delay.
func TestDrain(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	cfg := sidecarConfig(e)
	cfg.DrainDelay = time.Minute
	s := startSidecar(t, cfg)
	base := "http://" + s.DebugAddr()
	stream, cancel := watchPlain(t, s.GRPCAddr())
	next := func() *pb.LoadReport { // the next load report
		t.Helper()
		for range 1000 {
			u, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if l := u.GetLoad(); l != nil {
				return l
			}
		}
		t.Fatal("no load report in 1000 updates")
		return nil
	}
	if l := next(); l.Draining || l.DrainReason != "" {
		t.Fatalf("draining before any drain: %+v", l)
	}
	if code := getJSON(t, base+"/readyz", nil); code != http.StatusOK {
		t.Fatalf("readyz %d before the drain", code)
	}
	done := make(chan struct{})
	go func() { s.Drain(context.Background(), "test says so"); close(done) }()
	var l *pb.LoadReport
	for range 100 {
		if l = next(); l.Draining {
			break
		}
	}
	if !l.Draining || l.DrainReason != "test says so" {
		t.Fatalf("no drain reported: %+v", l)
	}
	for range 3 { // the scrapes' reports after it carry it too
		if l := next(); !l.Draining {
			t.Fatalf("a report after the drain without it: %+v", l)
		}
	}
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "draining (test says so)") {
		t.Fatalf("readyz while draining: %d %s", resp.StatusCode, body)
	}
	var st []sidecar.EndpointState
	getJSON(t, base+"/debug/state", &st)
	if len(st) != 1 || !st[0].Draining || st[0].DrainReason != "test says so" {
		t.Fatalf("/debug/state: %+v", st)
	}
	if v := metrictest.Gathered(t, s.Registry(), "kvroute_sidecar_draining", nil); v != 1 {
		t.Fatalf("kvroute_sidecar_draining %v", v)
	}
	select {
	case <-done:
		t.Fatal("Drain returned while a picker still watched")
	default:
	}
	cancel() // the last watcher goes: Drain ends, well before its minute
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Drain still waiting 10 s after the last watcher left")
	}
}

// TestDrainWithoutWatchers returns at once: there is nobody to tell.
func TestDrainWithoutWatchers(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	cfg := sidecarConfig(e)
	cfg.DrainDelay = time.Minute
	s := startSidecar(t, cfg)
	done := make(chan struct{})
	go func() { s.Drain(context.Background(), ""); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Drain waited with no picker watching")
	}
	var st []sidecar.EndpointState
	getJSON(t, "http://"+s.DebugAddr()+"/debug/state", &st)
	if len(st) != 1 || !st[0].Draining || st[0].DrainReason == "" {
		t.Fatalf("/debug/state: %+v", st)
	}
}
