package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/lab"
	"github.com/kvroute/kvroute/test/workload"
)

// labFlags are the settings of one lab sweep.
type labFlags struct {
	scenario, trace, policies, seeds, rates, out, profile, pickers string
	engines, gpuBlocks, cpuBlocks, workers, capacity, limit        int
	slo                                                            time.Duration
	delays                                                         lab.Delays
	isolated, enginePriority                                       bool
	bookingLoss                                                    float64
}

// labPolicies is the default comparison: kvroute against the four peers.
const labPolicies = "precise,llm-d,llm-d-calibrated,llm-d-precise,dynamo,sglang"

func newLabCommand() *cobra.Command {
	l := labFlags{delays: lab.DefaultDelays()}
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Compare routing policies in virtual time on the production cores",
		Long: `Run a scenario's requests through N simulated engines and M pickers in
virtual time, in one goroutine per run, with kvroute's own cores: the
engine's scheduler and paged KV cache, the sidecar's index and summary, the
picker's fleet state, decision, peers' policies and bookings (DESIGN.md
§14). No sockets; the delays between components are modelled (the delay
flags, defaults measured in docs/benchmarks.md). Deterministic: the same
scenario, seeds, rates and flags give a byte-identical results.json.

Each policy runs on every seed (--seeds A-B or a list) at every offered
rate (--rates, multiples of the scenario's nominal rate), on a fresh fleet
each time. Per policy and rate: the mean of each figure over the seeds with
its 95% interval. When a peer ran: per seed each policy's hit rate and TTFTs
÷ the best peer's on that seed, the mean ratio with a bootstrap 95%
interval. With several rates: goodput, the highest rate whose p90 TTFT is
within --slo with ≥ 99% of requests completed, per seed, with its interval.

--pickers M spreads requests over M pickers at random, as a Kubernetes
Service does, each with its own bookings (exchanged with the others unless
--isolated-pickers) and its own peer-policy state.
--pickers 1,2,4,8 runs the whole sweep at each count (the same seeds, rates
and policies) and compares each with one picker: per policy, count and
rate the hit rate, p99 TTFT, load CV (the requests per engine's standard
deviation ÷ mean) and warm returns, the hit rate and p99 TTFT ÷ one
picker's paired by seed with a bootstrap 95% interval, and with several
rates goodput and its ratio (results.json by_pickers; the rest of the file
is the sweep at one picker).

Defaults are tuned on seeds 1–10 only; claims use seeds from 101 up
(results.json claim_seeds says whether every seed is ≥ 101).

Writes DIR/results.json, DIR/summary.txt and DIR/report.html.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return l.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&l.scenario, "scenario", "agentic-pressure", "the scenario: "+strings.Join(workload.Names(), ", "))
	f.StringVar(&l.trace, "trace", "", "the Mooncake JSONL file of --scenario trace")
	f.IntVar(&l.limit, "limit", 0, "with --scenario trace: replay only the first N records (0: all)")
	f.StringVar(&l.policies, "policies", labPolicies, "routing policies, comma-separated")
	f.StringVar(&l.seeds, "seeds", "101-120", "seeds: A-B or a comma-separated list (claims use 101 and up; tune on 1-10)")
	f.StringVar(&l.rates, "rates", "1", "offered rates, comma-separated multiples of the scenario's nominal rate")
	f.DurationVar(&l.slo, "slo", 0, "the p90 TTFT objective of goodput (0: the scenario's)")
	f.IntVar(&l.engines, "engines", 0, "engines (0: the scenario's)")
	f.IntVar(&l.gpuBlocks, "gpu-blocks", 0, "KV blocks per engine (0: the scenario's)")
	f.StringVar(&l.profile, "profile", "", "the engines' latency profile (default: the scenario's, else "+profile.SimDefault+"): "+strings.Join(profile.Names(), ", "))
	f.IntVar(&l.cpuBlocks, "cpu-blocks", 0, "each engine's CPU offload tier in blocks, with vLLM's P2P tier (0: the scenario's; -1: none)")
	f.StringVar(&l.pickers, "pickers", "1", "pickers; requests are spread over them at random, as a Service does; a list (1,2,4,8) sweeps each count and compares it with 1")
	f.IntVar(&l.capacity, "capacity", 0, "the summaries' capacity in blocks, as sidecar and picker --capacity (0: their default, 65536)")
	f.IntVar(&l.workers, "workers", 0, "runs at once (0: one per CPU); results do not depend on it")
	f.StringVar(&l.out, "out", "", "the output directory (required)")
	f.DurationVar(&l.delays.EventToIndex, "event-to-index", l.delays.EventToIndex, "KV event to the sidecar's index")
	f.DurationVar(&l.delays.DeltaInterval, "delta-interval", l.delays.DeltaInterval, "the sidecar's summary delta tick")
	f.DurationVar(&l.delays.SummaryToPicker, "summary-to-picker", l.delays.SummaryToPicker, "a summary delta or load report from the sidecar to a picker")
	f.DurationVar(&l.delays.LoadPeriod, "load-period", l.delays.LoadPeriod, "the sidecar's load report period")
	f.DurationVar(&l.delays.Render, "render-time", l.delays.Render, "a request's render and decision in the picker")
	f.DurationVar(&l.delays.Hop, "hop", l.delays.Hop, "one way between a picker and an engine (and between two pickers)")
	f.DurationVar(&l.delays.BookingFlush, "bookings-flush", l.delays.BookingFlush, "how long a picker's booking changes wait before their batch goes to the other pickers")
	f.BoolVar(&l.isolated, "isolated-pickers", false, "the pickers do not exchange their bookings (an ablation)")
	f.BoolVar(&l.enginePriority, "engine-priority", false, "the engines schedule by priority (vLLM's --scheduling-policy priority) and kvroute's pickers set it (--engine-priority; a request's fairness key is its tenant); a peer policy sets none, as its own system does not")
	f.Float64Var(&l.bookingLoss, "booking-loss", 0, "the chance that a batch of bookings from one picker to another is lost (0..1)")
	return cmd
}

// sweep builds the sweep from the flags, and the numbers of pickers to
// run it at (one, or several to compare).
func (l *labFlags) sweep() (lab.Sweep, []int, error) {
	counts, err := parsePickers(l.pickers)
	if err != nil {
		return lab.Sweep{}, nil, err
	}
	sc, err := workload.Named(l.scenario, workload.NamedOptions{Trace: l.trace, TraceLimit: l.limit})
	if err != nil {
		return lab.Sweep{}, nil, err
	}
	seeds, err := parseSeeds(l.seeds)
	if err != nil {
		return lab.Sweep{}, nil, err
	}
	rates, err := parseRates(l.rates)
	if err != nil {
		return lab.Sweep{}, nil, err
	}
	var pols []string
	for _, p := range strings.Split(l.policies, ",") {
		p = strings.TrimSpace(p)
		pols = append(pols, p)
	}
	cfg := lab.DefaultConfig()
	cfg.Engines, cfg.GPUBlocks, cfg.Pickers, cfg.Delays, cfg.Profile, cfg.Capacity = l.engines, l.gpuBlocks, counts[0], l.delays, l.profile, l.capacity
	cfg.CPUBlocks, cfg.Isolated, cfg.BookingLoss, cfg.EnginePriority = l.cpuBlocks, l.isolated, l.bookingLoss, l.enginePriority
	if err := (lab.Sweep{Scenario: sc, Policies: pols, Seeds: seeds, Rates: rates, Fleet: cfg}).Validate(); err != nil {
		return lab.Sweep{}, nil, err
	}
	return lab.Sweep{Scenario: sc, Policies: pols, Seeds: seeds, Rates: rates, SLO: l.slo, Fleet: cfg, Workers: l.workers}, counts, nil
}

// parsePickers reads --pickers: a count, or a comma-separated list of
// them (lab.ValidatePickerCounts).
func parsePickers(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("--pickers %q: %q is not a number of pickers", s, f)
		}
		out = append(out, n)
	}
	return out, lab.ValidatePickerCounts(out)
}

func (l *labFlags) run(cmd *cobra.Command) error {
	if l.out == "" {
		return usageError(fmt.Errorf("--out DIR is required"))
	}
	s, counts, err := l.sweep()
	if err != nil {
		return usageError(err)
	}
	w := cmd.OutOrStdout()
	total := len(s.Policies) * len(s.Seeds) * len(s.Rates) * len(counts)
	if len(counts) == 1 {
		fmt.Fprintf(w, "lab %s: %d policies × %d seeds × %d rates = %d runs\n", s.Scenario.Name(), len(s.Policies), len(s.Seeds), len(s.Rates), total)
	} else {
		fmt.Fprintf(w, "lab %s: %d policies × %d seeds × %d rates × %d counts of pickers (%s) = %d runs\n", s.Scenario.Name(), len(s.Policies),
			len(s.Seeds), len(s.Rates), len(counts), l.pickers, total)
	}
	start := time.Now()
	s.Progress = func(done, total int) {
		if done%max(1, total/10) == 0 || done == total {
			fmt.Fprintf(cmd.ErrOrStderr(), "  %d/%d runs (%.0f s)\n", done, total, time.Since(start).Seconds())
		}
	}
	res, err := lab.RunByPickers(s, counts)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(l.out, 0o755); err != nil {
		return err
	}
	if err := lab.Write(l.out, res); err != nil {
		return err
	}
	fmt.Fprint(w, lab.Table(res))
	fmt.Fprintf(w, "%d runs in %.1f s of wall time; wrote %s\n", total, time.Since(start).Seconds(), filepath.Join(l.out, "results.json"))
	return nil
}

// parseSeeds reads A-B or a comma-separated list.
func parseSeeds(s string) ([]uint64, error) {
	if a, b, ok := strings.Cut(s, "-"); ok {
		lo, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 64)
		hi, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 64)
		if err1 != nil || err2 != nil || hi < lo || hi-lo >= 10000 {
			return nil, fmt.Errorf("--seeds %q: want A-B with A ≤ B (at most 10,000 seeds), or a list", s)
		}
		var out []uint64
		for x := lo; x <= hi; x++ {
			out = append(out, x)
		}
		return out, nil
	}
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		x, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--seeds %q: %q is not a seed", s, f)
		}
		out = append(out, x)
	}
	return out, nil
}

// parseRates reads a comma-separated list of positive multiples.
func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(x > 0) || x > 1000 {
			return nil, fmt.Errorf("--rates %q: %q is not a positive multiple of the nominal rate", s, f)
		}
		out = append(out, x)
	}
	return out, nil
}
