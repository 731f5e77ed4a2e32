package verify

import (
	"testing"
	"time"
)

func TestFullBlockTokens(t *testing.T) {
	for _, tc := range []struct{ prompt, block, want int }{
		{130, 16, 128}, {129, 16, 128}, {128, 16, 112}, {16, 16, 0}, {17, 16, 16}, {1, 16, 0}, {0, 16, 0},
		{40, 0, 40}, // no block size known: the prompt
	} {
		if got := FullBlockTokens(tc.prompt, tc.block); got != tc.want {
			t.Errorf("FullBlockTokens(%d, %d) = %d, want %d", tc.prompt, tc.block, got, tc.want)
		}
	}
}

func TestLagFigure(t *testing.T) {
	for secs, want := range map[float64]string{0.0042: "4.2 ms", 0.023: "23 ms", 0.9994: "999 ms", 1.4: "1.40 s", 12: "12.00 s"} {
		if got := LagFigure(secs); got != want {
			t.Errorf("LagFigure(%v) = %q, want %q", secs, got, want)
		}
	}
}

func TestJudgeLag(t *testing.T) {
	good := LagResult{Model: "a", Endpoint: "http://e", PromptTokens: 130, BlockSize: 16, FullTokens: 128, Predicted: true,
		LagSecs: 0.023, MostPredicted: 128, WaitedSecs: 0.03, Polls: 2}
	for _, tc := range []struct {
		name          string
		mutate        func(*LagResult)
		maxLag        time.Duration
		ok            bool
		detail, cause string
		figure        string
	}{
		{"healthy", func(*LagResult) {}, time.Second, true,
			"the picker predicted the prompt's 128 tokens of full blocks 23 ms after the engine answered (--max-lag 1s)", "", "23 ms"},
		{"just under", func(r *LagResult) { r.LagSecs = 0.999 }, time.Second, true, "999 ms", "", "999 ms"},
		{"at the limit", func(r *LagResult) { r.LagSecs = 1 }, time.Second, true, "1.00 s", "", "1.00 s"},
		{"above", func(r *LagResult) { r.LagSecs = 2.3 }, time.Second, false,
			"2.30 s after the engine answered: more than --max-lag 1s", "replay catch-ups", "2.30 s"},
		{"a tighter limit", func(*LagResult) {}, 20 * time.Millisecond, false, "more than --max-lag 20ms", "late", "23 ms"},
		{"never predicted", func(r *LagResult) {
			r.Predicted, r.LagSecs, r.MostPredicted, r.WaitedSecs, r.Polls = false, 0, 0, 5, 310
		}, time.Second, false,
			"the engine cached a 130-token prompt, but in 5.0 s (310 decisions) the picker never predicted its 128 tokens of full blocks there (at most 0)",
			"--kv-events-mode bind", "never predicted"},
		{"never fully predicted", func(r *LagResult) { r.Predicted, r.MostPredicted = false, 64 }, time.Second, false, "(at most 64)", "--kv-events-mode bind", "never predicted"},
		{"never predicted, the picker routes it by load", func(r *LagResult) {
			r.Predicted, r.PickerState, r.PickerReason = false, "load_only", "the sidecar reports its stream silent"
		}, time.Second, false, "never predicted", `the picker holds the endpoint "load_only", without cache knowledge: the sidecar reports its stream silent`, "never predicted"},
		{"never predicted, a cached endpoint", func(r *LagResult) { r.Predicted, r.PickerState = false, "cached" }, time.Second, false,
			"never predicted", "--kv-events-mode bind", "never predicted"},
		{"could not run", func(r *LagResult) { r.Err = "sent to http://e: status 500" }, time.Second, false, "status 500", "could not run", "not measured"},
	} {
		r := good
		tc.mutate(&r)
		c := JudgeLag(r, tc.maxLag)
		if c.Name != "probe lag" || c.Endpoint != "http://e" || c.Figure != tc.figure {
			t.Errorf("%s: %+v", tc.name, c)
		}
		judged(t, tc.name, c, tc.ok, tc.detail, tc.cause)
	}
}
