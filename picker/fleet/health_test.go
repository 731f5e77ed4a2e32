package fleet

import (
	"testing"
	"time"
)

func TestHealthAt(t *testing.T) {
	now := time.Unix(1000, 0)
	limit := 10 * time.Second
	for _, tc := range []struct {
		name   string
		loadAt time.Time
		want   Health
	}{
		{"no load report yet", time.Time{}, Routable},
		{"fresh report", now.Add(-time.Second), Routable},
		{"exactly at the limit", now.Add(-limit), Routable},
		{"past the limit", now.Add(-limit - time.Nanosecond), StaleLoad},
		{"report from the future (clock skew)", now.Add(time.Minute), Routable},
	} {
		e := Endpoint{LoadAt: tc.loadAt}
		if got := e.HealthAt(now, limit); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if Routable.String() != "routable" || StaleLoad.String() != "stale_load" || Health(9).String() != "unknown" {
		t.Error("health names")
	}
}
