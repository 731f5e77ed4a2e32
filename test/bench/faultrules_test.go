package bench

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestClassify is the router/unavoidable rule on a table: in flight on
// the killed or stopped engine or through the killed picker (started by
// the time the process was seen dead, failed no earlier than the signal)
// is unavoidable; everything else is the router's.
func TestClassify(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	incidents := []Incident{
		{Kind: IncidentEngine, Target: "http://e1", At: at(10), Until: at(10.2)}, // SIGKILL, reaped 200 ms later
		{Kind: IncidentEngine, Target: "http://e2", At: at(30)},                  // SIGSTOP
		{Kind: IncidentPicker, Target: "http://p1", At: at(50), Until: at(50.1)}, // picker SIGKILL
	}
	fail := errors.New("unexpected EOF")
	for _, tc := range []struct {
		name       string
		o          Outcome
		class      string
		incidentIx int
	}{
		{"in flight on the killed engine", Outcome{Endpoint: "http://e1", Start: at(9), End: at(10.1)}, ClassUnavoidable, 0},
		{"started between the signal and the death", Outcome{Endpoint: "http://e1", Start: at(10.1), End: at(10.2)}, ClassUnavoidable, 0},
		{"sent to the engine after it was seen dead", Outcome{Endpoint: "http://e1", Start: at(10.3), End: at(10.4)}, ClassRouter, -1},
		{"failed before the kill", Outcome{Endpoint: "http://e1", Start: at(8), End: at(9.9)}, ClassRouter, -1},
		{"another engine at the kill", Outcome{Endpoint: "http://e3", Start: at(9), End: at(10.1)}, ClassRouter, -1},
		{"no endpoint known (picker's 5xx)", Outcome{Start: at(9), End: at(10.1)}, ClassRouter, -1},
		{"in flight on the stopped engine, failing later", Outcome{Endpoint: "http://e2", Start: at(29), End: at(34)}, ClassUnavoidable, 1},
		{"started on the stopped engine just at the stop", Outcome{Endpoint: "http://e2", Start: at(30), End: at(31)}, ClassUnavoidable, 1},
		{"sent to the stopped engine after the stop", Outcome{Endpoint: "http://e2", Start: at(30.5), End: at(36)}, ClassRouter, -1},
		{"through the killed picker", Outcome{Picker: "http://p1", Endpoint: "http://e3", Start: at(49), End: at(50)}, ClassUnavoidable, 2},
		{"through the killed picker, no answer yet", Outcome{Picker: "http://p1", Start: at(50.05), End: at(50.1)}, ClassUnavoidable, 2},
		{"through the killed picker after it died", Outcome{Picker: "http://p1", Start: at(50.2), End: at(50.3)}, ClassRouter, -1},
		{"through the other picker at the kill", Outcome{Picker: "http://p0", Start: at(49), End: at(50.05)}, ClassRouter, -1},
		{"no incident at all", Outcome{Endpoint: "http://e1", Start: at(70), End: at(71)}, ClassRouter, -1},
	} {
		tc.o.Err = fail
		class, ix := Classify(tc.o, incidents)
		if class != tc.class || ix != tc.incidentIx {
			t.Errorf("%s: %s (incident %d), want %s (%d)", tc.name, class, ix, tc.class, tc.incidentIx)
		}
	}
	if c, _ := Classify(Outcome{Endpoint: "http://e1", Start: at(9), End: at(10.1), Err: fail}, nil); c != ClassRouter {
		t.Errorf("no incidents: %s", c)
	}
}

// TestRecoveryTime: the end of the first 5 s window from the restore,
// sliding by 1 s, with ≥ 5 requests and ≥ 95% of the hit rate before;
// windows past until do not count.
func TestRecoveryTime(t *testing.T) {
	// steady makes n requests a second from a to b with the hit rate h.
	steady := func(a, b float64, h float64) []hitPoint {
		var ps []hitPoint
		for x := a; x < b; x += 0.25 {
			ps = append(ps, hitPoint{T: x, Prompt: 1000, Cached: int(h * 1000)})
		}
		return ps
	}
	cat := func(ps ...[]hitPoint) []hitPoint {
		var out []hitPoint
		for _, p := range ps {
			out = append(out, p...)
		}
		return out
	}
	for _, tc := range []struct {
		name            string
		points          []hitPoint
		before          float64
		restored, until float64
		want            float64
		ok              bool
	}{
		{"no drop: the first window", steady(0, 100, 0.8), 0.8, 50, 100, 5, true},
		{"back at 60 s", cat(steady(50, 60, 0.2), steady(60, 100, 0.8)), 0.8, 50, 100, 15, true},
		{"within 5% counts", cat(steady(50, 60, 0.2), steady(60, 100, 0.761)), 0.8, 50, 100, 15, true},
		{"just under 95% never does", cat(steady(50, 60, 0.2), steady(60, 100, 0.759)), 0.8, 50, 100, 0, false},
		{"back only after the next fault", cat(steady(50, 80, 0.2), steady(80, 100, 0.8)), 0.8, 50, 80, 0, false},
		{"too few requests in a window", []hitPoint{{T: 51, Prompt: 10, Cached: 10}, {T: 52, Prompt: 10, Cached: 10}}, 0.5, 50, 100, 0, false},
		{"no hit rate before: back at once", steady(50, 100, 0), 0, 50, 100, 5, true},
	} {
		got, ok := recoveryTime(tc.points, tc.before, tc.restored, tc.until)
		if ok != tc.ok || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	if r, n := hitRate(steady(0, 10, 0.5), 2, 4); n != 8 || r != 0.5 {
		t.Errorf("hitRate: %v over %d", r, n)
	}
	if r, n := hitRate(nil, 0, 1); r != 0 || n != 0 {
		t.Errorf("hitRate of nothing: %v %d", r, n)
	}
}

// TestCounterTrack: totals run on across a restart (a value going down
// is the new process counting from 0), and countsBetween takes the last
// snapshot at or before each end.
func TestCounterTrack(t *testing.T) {
	var c counterTrack
	steps := []struct {
		in   map[string]float64
		want map[string]float64
	}{
		{map[string]float64{"as_predicted": 5}, map[string]float64{"as_predicted": 5}},
		{map[string]float64{"as_predicted": 9, "load_only": 1}, map[string]float64{"as_predicted": 9, "load_only": 1}},
		{map[string]float64{"as_predicted": 2}, map[string]float64{"as_predicted": 11, "load_only": 1}}, // restarted
		{map[string]float64{"as_predicted": 2}, map[string]float64{"as_predicted": 11, "load_only": 1}}, // down: the last values again
		{map[string]float64{"as_predicted": 4, "load_only": 3}, map[string]float64{"as_predicted": 13, "load_only": 4}},
	}
	var snaps []counterSnap
	for i, st := range steps {
		got := c.observe(st.in)
		for k, v := range st.want {
			if got[k] != v {
				t.Fatalf("step %d: %v, want %v", i, got, st.want)
			}
		}
		snaps = append(snaps, counterSnap{T: float64(10 * i), Totals: got})
	}
	got := countsBetween(snaps, 15, 40) // from the snapshot at 10 to the one at 40
	if len(got) != 2 || got["as_predicted"] != 4 || got["load_only"] != 3 {
		t.Fatalf("countsBetween: %v", got)
	}
	if got := countsBetween(snaps, -1, 5); got["as_predicted"] != 5 {
		t.Fatalf("from before the first snapshot: %v", got)
	}
}

// TestGrowth: medians of the first and last minute (thirds of a short
// run), failed goroutine scrapes left out, no goroutine figures when none
// was exported.
func TestGrowth(t *testing.T) {
	var ts, rss []float64
	var gor []int
	for x := 0.0; x <= 300; x += 2 {
		ts, rss = append(ts, x), append(rss, 100+x/30) // 100 → 110 MiB
		g := 50
		if int(x)%20 == 0 {
			g = -1
		}
		gor = append(gor, g)
	}
	g := growth(ts, rss, gor)
	if g.SpanSeconds != 60 || math.Abs(g.RSSFirstMiB-101) > 1e-9 || math.Abs(g.RSSLastMiB-109) > 1e-9 {
		t.Fatalf("growth %+v", g)
	}
	if math.Abs(g.RSSGrowth-(109.0/101-1)) > 1e-9 || g.GoroutinesStart == nil || *g.GoroutinesStart != 50 || *g.GoroutinesGrowth != 0 {
		t.Fatalf("growth %+v", g)
	}
	short := growth([]float64{0, 10, 20, 30, 40, 50, 60}, []float64{1, 1, 1, 2, 3, 3, 3}, nil)
	if short.SpanSeconds != 20 || short.RSSFirstMiB != 1 || short.RSSLastMiB != 3 || short.GoroutinesStart != nil {
		t.Fatalf("short run: %+v", short)
	}
	if (growth(nil, nil, nil) != Growth{}) {
		t.Fatal("no samples")
	}
}

// TestParseFamily reads counters by label and a bare gauge from the text
// format, ignoring families whose names merely start alike.
func TestParseFamily(t *testing.T) {
	page := `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 42
go_goroutines_extra 7
kvroute_picker_outcomes_total{outcome="as_predicted"} 12
kvroute_picker_outcomes_total{outcome="load_only"} 3
kvroute_picker_outcomes_totally{outcome="x"} 9
`
	g, err := parseFamily(stringsReader(page), "go_goroutines", "")
	if err != nil || len(g) != 1 || g[""] != 42 {
		t.Fatalf("go_goroutines: %v %v", g, err)
	}
	o, err := parseFamily(stringsReader(page), "kvroute_picker_outcomes_total", "outcome")
	if err != nil || len(o) != 2 || o["as_predicted"] != 12 || o["load_only"] != 3 {
		t.Fatalf("outcomes: %v %v", o, err)
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
