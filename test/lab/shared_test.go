package lab

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/test/workload"
)

// TestSharedBookings: the lab's pickers exchange their bookings through
// the routers' own journal and Apply, a flush and a hop apart. Without
// loss every picker holds the others' picks and nothing expires; when
// every batch is lost the run is the isolated one, decision for decision
// (the engines' reports are all a picker learns then); with batches lost
// at random, the releases lost leave phantoms that expire at the
// lifetime, and none is left after it.
func TestSharedBookings(t *testing.T) {
	sc := convos{n: 24, turns: 3, engines: 4}
	o := workload.Options{Seed: 3, Rate: 6}
	const lifetime = 2 * time.Second
	do := func(isolated bool, loss float64) ([]Outcome, *run) {
		t.Helper()
		cfg := DefaultConfig()
		cfg.Pickers, cfg.Isolated, cfg.BookingLoss = 4, isolated, loss
		cfg.Tune = func(c *picker.Config) { c.PeerBookingLifetime = lifetime }
		var rr *run
		out, _, err := runWith(cfg, sc, o, func(r *run) { rr = r })
		if err != nil {
			t.Fatal(err)
		}
		return out, rr
	}
	endpoints := func(out []Outcome) []string {
		var s []string
		for _, x := range out {
			s = append(s, x.Endpoint)
		}
		return s
	}
	iso, _ := do(true, 0)
	shared, rs := do(false, 0)
	lost, _ := do(false, 1)
	_, rl := do(false, 0.3)

	for _, p := range rs.pickers {
		peers := p.router.PickerBookings()
		if len(peers) != len(rs.pickers)-1 {
			t.Fatalf("%s holds bookings of %d pickers, want %d", p.name, len(peers), len(rs.pickers)-1)
		}
		for name, st := range peers {
			if st.Added == 0 || st.Expired != 0 || st.Awaiting != 0 {
				t.Errorf("%s of %s, no loss: %+v (want adds, none expired, none awaiting at the end)", p.name, name, st)
			}
		}
	}
	if a, b := endpoints(iso), endpoints(lost); !slices.Equal(a, b) {
		t.Errorf("every batch lost: the decisions differ from the isolated run's")
	}
	if a, b := endpoints(iso), endpoints(shared); slices.Equal(a, b) {
		t.Errorf("sharing the bookings changed no decision: the exchange is not counted")
	}
	expired := uint64(0)
	end := rl.sim.clock().Add(lifetime)
	for _, p := range rl.pickers {
		p.router.ApplyBookings("nobody", nil, end) // the clock past every lifetime
		for name, st := range p.router.PickerBookings() {
			expired += st.Expired
			if st.Awaiting != 0 || st.Live != 0 {
				t.Errorf("%s still holds %s's bookings past their lifetime: %+v", p.name, name, st)
			}
		}
	}
	if expired == 0 {
		t.Errorf("30%% of the batches lost, and no booking expired awaiting its first token")
	}
}
