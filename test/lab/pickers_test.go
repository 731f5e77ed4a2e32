package lab

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

// TestByPickers: a sweep at 1 and 2 pickers holds the comparison — a row
// per policy, count and rate, the ratios at 2 pickers paired seed by seed
// with the runs at 1 (the same policy, seed and rate), goodput's ratio
// with several rates, load CV and warm returns within their ranges — and
// the sweep at 2 pickers, and shows it in summary.txt and report.html.
func TestByPickers(t *testing.T) {
	sc := convos{n: 8, turns: 3, engines: 3}
	s := Sweep{Scenario: sc, Policies: []string{"precise", "sglang"}, Seeds: []uint64{1, 2}, Rates: []float64{1, 4}, Fleet: DefaultConfig()}
	r, err := RunByPickers(s, []int{2, 1})
	if err != nil {
		t.Fatal(err)
	}
	bp := r.ByPickers
	if r.Pickers != 1 || bp == nil {
		t.Fatalf("top level at %d pickers, by_pickers %v: want the sweep at 1 with the comparison", r.Pickers, bp)
	}
	if len(bp.Counts) != 2 || bp.Counts[0] != 1 || bp.Counts[1] != 2 || len(bp.Sweeps) != 1 || bp.Sweeps[0].Pickers != 2 || bp.Sweeps[0].ByPickers != nil {
		t.Fatalf("counts %v, %d sweeps", bp.Counts, len(bp.Sweeps))
	}
	if len(bp.Rows) != 2*2*2 || len(bp.Goodput) != 2*2 {
		t.Fatalf("%d rows, %d goodputs: want 8 and 4", len(bp.Rows), len(bp.Goodput))
	}
	one, two := runsOf(r), runsOf(bp.Sweeps[0])
	for _, x := range bp.Rows {
		if x.Pickers == 1 {
			if x.HitRatio != nil || x.TTFTP99Ratio != nil {
				t.Errorf("%+v: a ratio at 1 picker", x)
			}
		} else {
			if x.HitRatio == nil || x.TTFTP99Ratio == nil || x.HitRatio.Ratio.N != 2 || x.TTFTP99Ratio.Ratio.N != 2 {
				t.Fatalf("%+v: want ratios over 2 seeds at 2 pickers", x)
			}
			for i, seed := range s.Seeds {
				k := runKey{x.Policy, x.Rate, seed}
				if want := float64(two[k].HitRate) / float64(one[k].HitRate); math.Abs(float64(x.HitRatio.PerSeed[i])-want) > 1e-12 {
					t.Errorf("%s ×%g seed %d: hit ratio %v, want %v (2 pickers ÷ 1 on that seed)", x.Policy, x.Rate, seed, x.HitRatio.PerSeed[i], want)
				}
				if want := float64(two[k].TTFTP99) / float64(one[k].TTFTP99); math.Abs(float64(x.TTFTP99Ratio.PerSeed[i])-want) > 1e-12 {
					t.Errorf("%s ×%g seed %d: p99 ratio %v, want %v", x.Policy, x.Rate, seed, x.TTFTP99Ratio.PerSeed[i], want)
				}
			}
			if m := float64(x.HitRatio.Ratio.Mean); !(m > 0.5 && m < 2) || !(x.HitRatio.Ratio.Lo <= x.HitRatio.Ratio.Mean && x.HitRatio.Ratio.Mean <= x.HitRatio.Ratio.Hi) {
				t.Errorf("%s ×%g: hit ratio %+v", x.Policy, x.Rate, x.HitRatio.Ratio)
			}
		}
		sweep := r
		if x.Pickers == 2 {
			sweep = bp.Sweeps[0]
		}
		if sm := summaryFor(sweep, x.Policy, x.Rate); sm == nil || sm.HitRate != x.HitRate || sm.LoadCV != x.LoadCV || sm.WarmReturnRate != x.WarmReturnRate {
			t.Errorf("%+v: not the sweep's summary %+v", x, sm)
		}
		if cv := float64(x.LoadCV.Mean); !(cv >= 0 && cv <= math.Sqrt(2)) {
			t.Errorf("%s at %d: load CV %v outside [0, √(engines−1)]", x.Policy, x.Pickers, cv)
		}
		if w := float64(x.WarmReturnRate.Mean); !(w >= 0 && w <= 1) {
			t.Errorf("%s at %d: warm returns %v", x.Policy, x.Pickers, w)
		}
		if x.HitRate.N != 2 || !(x.HitRate.Mean > 0) {
			t.Errorf("%s at %d: hit rate %+v", x.Policy, x.Pickers, x.HitRate)
		}
	}
	for _, g := range bp.Goodput {
		if (g.Pickers == 1) != (g.Ratio == nil) || g.Goodput.N != 2 {
			t.Errorf("goodput %+v", g)
		}
	}
	tab := Table(r)
	if !strings.Contains(tab, "by pickers: the sweep at 1, 2 pickers") || !strings.Contains(tab, "goodput by pickers") || !strings.Contains(tab, "load CV") {
		t.Errorf("summary lacks the comparison by pickers:\n%s", tab)
	}
	var page bytes.Buffer
	if err := WriteReport(&page, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "<h3>By pickers</h3>") || !strings.Contains(page.String(), "p99 ÷ 1") {
		t.Error("report.html lacks the comparison by pickers")
	}
	b, err := Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"by_pickers": {`)) || !bytes.Contains(b, []byte(`"hit_rate_ratio"`)) || !bytes.Contains(b, []byte(`"load_cv"`)) {
		t.Error("results.json lacks by_pickers")
	}
	t.Log("\n" + tab)
}

// TestByPickersOneCount: one count is the sweep at that count, byte for
// byte, without a comparison.
func TestByPickersOneCount(t *testing.T) {
	s := Sweep{Scenario: convos{n: 6, turns: 2, engines: 2}, Policies: []string{"precise"}, Seeds: []uint64{1}, Fleet: DefaultConfig()}
	got, err := RunByPickers(s, []int{2})
	if err != nil {
		t.Fatal(err)
	}
	s.Fleet.Pickers = 2
	want, err := RunSweep(s)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := Encode(got)
	b, _ := Encode(want)
	if got.ByPickers != nil || !bytes.Equal(a, b) || Table(got) != Table(want) {
		t.Error("one count of pickers is not the sweep at that count")
	}
}

func TestValidatePickerCounts(t *testing.T) {
	for _, c := range []struct {
		counts []int
		want   string
	}{
		{[]int{1}, ""}, {[]int{3}, ""}, {[]int{1, 2, 4, 8}, ""}, {[]int{8, 1}, ""},
		{nil, "no count"}, {[]int{0}, "want ≥ 1"}, {[]int{1, 2, 2}, "2 twice"}, {[]int{2, 4}, "list 1 too"},
	} {
		err := ValidatePickerCounts(c.counts)
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.counts, err, c.want)
		}
	}
}

// TestLoadSpread: the busiest ÷ the mean and the coefficient of
// variation (population) of the requests per engine, engines that served
// none counted.
func TestLoadSpread(t *testing.T) {
	engines := []string{"a", "b", "c", "d"}
	for _, c := range []struct {
		per     map[string]int
		imb, cv float64
	}{
		{map[string]int{"a": 5, "b": 5, "c": 5, "d": 5}, 1, 0},
		{map[string]int{"a": 4, "b": 4}, 2, 1},    // mean 2, σ 2
		{map[string]int{"a": 8}, 4, math.Sqrt(3)}, // mean 2, σ √12
		// x is no engine of the fleet; a 3, b 1, c 0, d 0: mean 1,
		// variance (4+0+1+1)/4 = 1.5.
		{map[string]int{"a": 3, "b": 1, "x": 9}, 3, math.Sqrt(1.5)},
	} {
		imb, cv := loadSpread(c.per, engines)
		if math.Abs(float64(imb)-c.imb) > 1e-12 || math.Abs(float64(cv)-c.cv) > 1e-12 {
			t.Errorf("%v: imbalance %v, CV %v; want %v, %v", c.per, imb, cv, c.imb, c.cv)
		}
	}
	if imb, cv := loadSpread(map[string]int{}, engines); !math.IsNaN(float64(imb)) || !math.IsNaN(float64(cv)) {
		t.Errorf("none served: %v, %v; want NaN", imb, cv)
	}
}

// TestWarmReturns: a warm return is a completed later turn that landed
// where its previous turn went; first turns, failures and turns whose
// previous endpoint is unknown are no continuations.
func TestWarmReturns(t *testing.T) {
	ok := 200
	outs := []Outcome{
		{Turn: 1, Endpoint: "a", Status: ok},
		{Turn: 2, PrevEndpoint: "a", Endpoint: "a", Status: ok},  // warm
		{Turn: 3, PrevEndpoint: "a", Endpoint: "b", Status: ok},  // cold
		{Turn: 2, PrevEndpoint: "b", Endpoint: "b", Status: ok},  // warm
		{Turn: 2, PrevEndpoint: "", Endpoint: "b", Status: ok},   // previous unknown
		{Turn: 2, PrevEndpoint: "a", Endpoint: "a", Status: 502}, // failed
	}
	for i := range outs {
		outs[i].Start, outs[i].End, outs[i].TTFT, outs[i].PromptTokens = time.Duration(i), time.Duration(i+1), 1, 10
	}
	f := figuresOf(outs, []string{"a", "b"})
	if f.Continuations != 3 || math.Abs(float64(f.WarmReturnRate)-2.0/3) > 1e-12 {
		t.Errorf("continuations %d, warm returns %v; want 3 and 2/3", f.Continuations, f.WarmReturnRate)
	}
	if f := figuresOf(outs[:1], []string{"a", "b"}); f.Continuations != 0 || !math.IsNaN(float64(f.WarmReturnRate)) {
		t.Errorf("no continuation: %d, %v; want 0 and NaN", f.Continuations, f.WarmReturnRate)
	}
}
