package lab

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kvroute/kvroute/test/lab/stats"
)

// ByPickers is a sweep run once per number of pickers (the same
// scenario, policies, seeds and rates each time; DESIGN.md §16) and set
// against one picker. Results' top level is the sweep at one picker;
// ByPickers holds the comparison and the sweeps at the other counts.
type ByPickers struct {
	// Counts are the numbers of pickers swept, ascending, 1 first.
	Counts []int `json:"counts"`
	// Rows are per policy, count and rate (in that order): the figures'
	// means over the seeds and, past one picker, the paired ratios to it.
	Rows []PickerRow `json:"rows"`
	// Goodput, with several rates, is per policy and count: goodput over
	// the seeds and, past one picker, its paired ratio to it.
	Goodput []PickerGoodput `json:"goodput,omitempty"`
	// Sweeps are the sweeps at each count but 1, in Counts' order (each
	// a whole results.json of its own, without by_pickers).
	Sweeps []*Results `json:"sweeps"`
}

// PickerRow is one policy's figures at one count and rate: means over
// the seeds with their 95% intervals (the sweep's Summary), and past one
// picker each figure ÷ one picker's, paired by seed (the same policy,
// seed and rate): the mean ratio with a bootstrap 95% interval.
type PickerRow struct {
	Policy         string  `json:"policy"`
	Pickers        int     `json:"pickers"`
	Rate           float64 `json:"rate"`
	HitRate        CI      `json:"hit_rate"`
	TTFTP99        CI      `json:"ttft_p99_ms"`
	LoadCV         CI      `json:"load_cv"`
	WarmReturnRate CI      `json:"warm_return_rate"`
	HitRatio       *Paired `json:"hit_rate_ratio,omitempty"`
	TTFTP99Ratio   *Paired `json:"ttft_p99_ratio,omitempty"`
}

// PickerGoodput is one policy's goodput at one count, and past one
// picker its ratio to one picker's, paired by seed.
type PickerGoodput struct {
	Policy  string  `json:"policy"`
	Pickers int     `json:"pickers"`
	Goodput CI      `json:"goodput"`
	Ratio   *Paired `json:"ratio,omitempty"`
}

// Paired is a paired ratio: per seed the value ÷ the baseline's on that
// seed (null where undefined), and their mean with a bootstrap 95%
// interval (stats.PairedRatio).
type Paired struct {
	Ratio   CI    `json:"ratio"`
	PerSeed []Num `json:"per_seed"`
}

// ValidatePickerCounts checks counts for RunByPickers: each ≥ 1, none
// twice, and 1 among them when there are several (the baseline).
func ValidatePickerCounts(counts []int) error {
	var errs []error
	if len(counts) == 0 {
		errs = append(errs, errors.New("--pickers: no count"))
	}
	for i, n := range counts {
		if n < 1 {
			errs = append(errs, fmt.Errorf("--pickers %d: want ≥ 1", n))
		}
		if slices.Contains(counts[:i], n) {
			errs = append(errs, fmt.Errorf("--pickers: %d twice", n))
		}
	}
	if len(counts) > 1 && !slices.Contains(counts, 1) {
		errs = append(errs, fmt.Errorf("--pickers %v: a comparison by pickers sets each count against 1: list 1 too", counts))
	}
	return errors.Join(errs...)
}

// RunByPickers runs s once per count of pickers (s.Fleet.Pickers set to
// each; everything else the same) and compares them. With one count it
// is RunSweep at that count, byte for byte. With several, the result is
// the sweep at one picker with ByPickers set; s.Progress, when set, is
// told of the runs of every count as one total.
func RunByPickers(s Sweep, counts []int) (*Results, error) {
	if err := ValidatePickerCounts(counts); err != nil {
		return nil, err
	}
	if len(counts) == 1 {
		s.Fleet.Pickers = counts[0]
		return RunSweep(s)
	}
	counts = slices.Clone(counts)
	slices.Sort(counts)
	progress := s.Progress
	var sweeps []*Results
	for k, n := range counts {
		one := s
		one.Fleet.Pickers = n
		if progress != nil {
			one.Progress = func(done, total int) { progress(k*total+done, len(counts)*total) }
		}
		r, err := RunSweep(one)
		if err != nil {
			return nil, fmt.Errorf("%d pickers: %w", n, err)
		}
		sweeps = append(sweeps, r)
	}
	base := sweeps[0]
	base.ByPickers = byPickersOf(counts, sweeps)
	return base, nil
}

// runKey finds a run of a sweep.
type runKey struct {
	policy string
	rate   float64
	seed   uint64
}

// runsOf indexes r's runs.
func runsOf(r *Results) map[runKey]*Figures {
	out := make(map[runKey]*Figures, len(r.Runs))
	for i := range r.Runs {
		x := &r.Runs[i]
		out[runKey{x.Policy, x.Rate, x.Seed}] = &x.Figures
	}
	return out
}

// byPickersOf compares sweeps (one per count, counts ascending from 1,
// each over the same policies, seeds and rates) with the first.
func byPickersOf(counts []int, sweeps []*Results) *ByPickers {
	base := sweeps[0]
	b := &ByPickers{Counts: counts, Sweeps: sweeps[1:]}
	baseRuns := runsOf(base)
	for _, p := range base.Policies {
		for i, n := range counts {
			r := sweeps[i]
			runs := runsOf(r)
			for k, rate := range base.Rates {
				row := PickerRow{Policy: p, Pickers: n, Rate: rate}
				if s := summaryFor(r, p, rate); s != nil {
					row.HitRate, row.TTFTP99, row.LoadCV, row.WarmReturnRate = s.HitRate, s.TTFTP99, s.LoadCV, s.WarmReturnRate
				}
				if i > 0 {
					series := func(m map[runKey]*Figures, of func(*Figures) Num) []float64 {
						v := make([]float64, len(base.Seeds))
						for j, seed := range base.Seeds {
							v[j] = float64(of(m[runKey{p, rate, seed}]))
						}
						return v
					}
					hit := func(f *Figures) Num { return f.HitRate }
					p99 := func(f *Figures) Num { return f.TTFTP99 }
					row.HitRatio = pairedOf(series(runs, hit), series(baseRuns, hit), uint64(k)+1)
					row.TTFTP99Ratio = pairedOf(series(runs, p99), series(baseRuns, p99), uint64(k)+1)
				}
				b.Rows = append(b.Rows, row)
			}
			if len(base.Rates) < 2 {
				continue
			}
			g, g1 := goodputFor(r, p), goodputFor(base, p)
			if g == nil || g1 == nil {
				continue
			}
			pg := PickerGoodput{Policy: p, Pickers: n, Goodput: g.Goodput}
			if i > 0 {
				pg.Ratio = pairedOf(nums(g.PerSeed), nums(g1.PerSeed), uint64(len(base.Rates))+1)
			}
			b.Goodput = append(b.Goodput, pg)
		}
	}
	return b
}

// pairedOf is x ÷ base paired by seed (stats.PairedRatio, its bootstrap
// seeded by seed).
func pairedOf(x, base []float64, seed uint64) *Paired {
	iv, per := stats.PairedRatio(x, base, seed)
	p := &Paired{Ratio: ciOf(iv), PerSeed: make([]Num, len(per))}
	for i, v := range per {
		p.PerSeed[i] = Num(v)
	}
	return p
}

func nums(v []Num) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// summaryFor is r's summary of policy p at rate (nil: none).
func summaryFor(r *Results, p string, rate float64) *Summary {
	for i := range r.Summary {
		if s := &r.Summary[i]; s.Policy == p && s.Rate == rate {
			return s
		}
	}
	return nil
}

// goodputFor is r's goodput of policy p (nil: none).
func goodputFor(r *Results, p string) *Goodput {
	for i := range r.Goodput {
		if g := &r.Goodput[i]; g.Policy == p {
			return g
		}
	}
	return nil
}
