package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestSpreadOverPickers: with two pickers, the client sends each request
// to one of them at random — both receive some — and the figures are
// produced, the pickers' decisions and overhead samples summed over
// both; each picker runs its own gRPC and bookings listeners and follows
// the other's bookings.
func TestSpreadOverPickers(t *testing.T) {
	res, err := Run(context.Background(), Options{Scenario: SeedContinuation{Conversations: 6, OutputTokens: 8},
		Policies: []score.Policy{score.Precise}, Engines: 2, Pickers: 2, TimeScale: 0, Seed: 7, SampleEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Policies["precise"]
	if res.Fleet.Pickers != 2 || p.Errors != 0 || p.Requests != 12 {
		t.Fatalf("%d pickers, %d requests, %d errors: want 2, 12, 0", res.Fleet.Pickers, p.Requests, p.Errors)
	}
	if len(p.PickerRequests) != 2 || p.PickerRequests[0] == 0 || p.PickerRequests[1] == 0 || p.PickerRequests[0]+p.PickerRequests[1] != 12 {
		t.Fatalf("requests per picker %v: want both pickers sent some of 12", p.PickerRequests)
	}
	decided := 0
	for _, n := range p.Decisions {
		decided += n
	}
	if decided != 12 || p.PickOverheadUs.Samples != 12 {
		t.Fatalf("decisions %v (%d), %d overhead samples: want the 12 requests over both pickers", p.Decisions, decided, p.PickOverheadUs.Samples)
	}
	if !(p.LoadCV >= 0) || p.LoadImbalance < 1 {
		t.Fatalf("load CV %v, imbalance %v", p.LoadCV, p.LoadImbalance)
	}
	if tab := Table(res); !strings.Contains(tab, "2 pickers, each request sent to one drawn at random") || !strings.Contains(tab, "load CV") {
		t.Errorf("table:\n%s", tab)
	}

	f, err := StartFleet(context.Background(), FleetConfig{Engines: 2, GPUBlocks: 256, TimeScale: 0, Policy: score.Precise, Pickers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var addrs []string
	for _, pk := range f.Pickers() {
		for _, a := range []string{pk.GRPCAddr(), pk.PeerAddr()} {
			if a == "" || slices.Contains(addrs, a) {
				t.Fatalf("picker gRPC and bookings addresses %v, then %q: want one each", addrs, a)
			}
			addrs = append(addrs, a)
		}
	}
	if urls := f.PickerURLs(); len(urls) != 2 || urls[0] == urls[1] {
		t.Fatalf("picker URLs %v", urls)
	}
	// Each picker was told the other's gRPC address: each follows the
	// other's bookings.
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		for i, reg := range f.regs {
			if n := gauge(t, reg, "kvroute_picker_pickers_following"); n != 1 {
				return fmt.Errorf("picker %d follows %v pickers, want 1", i, n)
			}
		}
		return nil
	})
}

// gauge is the value of the gauge name in reg (summed over its series).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, fam := range fams {
		if fam.GetName() == name {
			for _, m := range fam.Metric {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// TestLoadSpread: the busiest engine ÷ the mean, and the coefficient of
// variation (population) of the requests per engine.
func TestLoadSpread(t *testing.T) {
	for _, c := range []struct {
		per     []int
		imb, cv float64
	}{{[]int{3, 3, 3}, 1, 0}, {[]int{4, 4, 0, 0}, 2, 1}, {[]int{0, 0}, 0, 0}} {
		if imb, cv := loadSpread(c.per); imb != c.imb || cv != c.cv {
			t.Errorf("%v: %v, %v; want %v, %v", c.per, imb, cv, c.imb, c.cv)
		}
	}
}
