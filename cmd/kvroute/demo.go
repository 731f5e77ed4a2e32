package main

import (
	"context"
	"fmt"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/bench"
	"github.com/kvroute/kvroute/test/lab"
	"github.com/kvroute/kvroute/test/workload"
)

func newDemoCommand() *cobra.Command {
	var out, logLevel, listen string
	var keep, withLab bool
	var timeScale float64
	var seed uint64
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the embedded demo: a small fleet, an agentic workload, a report",
		Long: `Start a fleet of 4 simulated engines (kvroute engine), a sidecar each and a
picker on 127.0.0.1, drive a short agentic workload through it (16 agent
sessions of 4 types, 4–8 tool-call turns, 2 tenants) once per routing policy
— round-robin, least-loaded, prefix-hash and precise, a fresh fleet each —
print the side-by-side table and write DIR/report.html (with results.json
and summary.txt). About a minute at the default time scale.

Before that, the lab (kvroute lab: the same cores in virtual time) runs the
same workload with kvroute's precise policy against the four peers' —
llm-d (default and calibrated), llm-d-precise, dynamo, sglang — on seeds ` + demoLabSeeds + ` at ×` + demoLabRates + ` the
nominal rate, and the report gains its section: each figure's mean with a
95% interval, each policy ÷ the best peer per seed, and goodput.

With --keep-running, a fleet routed by precise stays up afterwards: the
picker's URL and a curl example are printed; Ctrl-C stops it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeScale < 0 {
				return usageError(fmt.Errorf("--time-scale %v: want ≥ 0", timeScale))
			}
			log, err := newLogger(logLevel)
			if err != nil {
				return usageError(err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			w := cmd.OutOrStdout()
			demo := workload.Demo()
			sc := bench.Plan(demo, seed, 1)
			var labRes *lab.Results
			if withLab {
				if labRes, err = demoLab(cmd, demo); err != nil {
					return err
				}
			}
			fmt.Fprintf(w, "kvroute demo: %d engines, a sidecar each and a picker on 127.0.0.1; %s; policies round-robin, least-loaded, prefix-hash, precise\n",
				sc.Fleet().Engines, sc.Name())
			if err := runBench(ctx, w, bench.Options{Scenario: sc, Policies: []score.Policy{score.RoundRobin, score.LeastLoaded, score.PrefixHash, score.Precise},
				TimeScale: timeScale, Seed: seed, Log: log, Lab: labRes}, out); err != nil {
				return err
			}
			if !keep {
				return nil
			}
			fc := sc.Fleet()
			fc.TimeScale, fc.Policy, fc.Log, fc.PickerListen = timeScale, score.Precise, log, listen
			f, err := bench.StartFleet(ctx, fc)
			if err != nil {
				return err
			}
			defer f.Close()
			u := f.PickerURL()
			fmt.Fprintf(w, `
fleet running: %d engines with sidecars, picker (policy precise) at %s
  try:      curl -sD - %s/v1/chat/completions -H 'Content-Type: application/json' \
              -d '{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'
  decision: curl -s '%s/routing/v1/pick?explain=true' -H 'Content-Type: application/json' \
              -d '{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"Hello"}]}'
  admin:    %s/debug/endpoints  %s/metrics
Ctrl-C stops it.
`, fc.Engines, u, u, u, f.AdminURL(), f.AdminURL())
			<-ctx.Done()
			stop() // a second Ctrl-C ends the process at once
			fmt.Fprintln(w, "stopping")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "demo-report", "directory for report.html, results.json and summary.txt")
	f.BoolVar(&keep, "keep-running", false, "leave a fleet (policy precise) up afterwards and print its URL")
	f.StringVar(&listen, "listen", "127.0.0.1:0", "with --keep-running: the picker's HTTP address")
	f.Float64Var(&timeScale, "time-scale", 1, "simulated engine time: 1 real time, 0.5 twice as fast, 0 no waiting")
	f.Uint64Var(&seed, "seed", 1, "workload seed")
	f.BoolVar(&withLab, "lab", true, "also compare kvroute with the four peers in the lab (virtual time, seeds "+demoLabSeeds+", rates ×"+demoLabRates+")")
	f.StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	return cmd
}

// The demo's lab sweep: kvroute against the four peers, ten claim seeds,
// three rates — about half a minute on two cores.
const (
	demoLabSeeds    = "101-110"
	demoLabRates    = "1,2,4"
	demoLabPolicies = "precise,llm-d,llm-d-calibrated,llm-d-precise,dynamo,sglang"
)

// demoLab runs the demo's lab sweep and prints its table.
func demoLab(cmd *cobra.Command, sc workload.Scenario) (*lab.Results, error) {
	seeds, err := parseSeeds(demoLabSeeds)
	if err != nil {
		return nil, err
	}
	rates, err := parseRates(demoLabRates)
	if err != nil {
		return nil, err
	}
	w := cmd.OutOrStdout()
	s := lab.Sweep{Scenario: sc, Policies: strings.Split(demoLabPolicies, ","), Seeds: seeds, Rates: rates, Fleet: lab.DefaultConfig()}
	fmt.Fprintf(w, "kvroute demo, lab: %s in virtual time, policies %s, seeds %s, rates ×%s\n", sc.Name(), demoLabPolicies, demoLabSeeds, demoLabRates)
	start := time.Now()
	res, err := lab.RunSweep(s)
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	fmt.Fprint(w, lab.Table(res))
	fmt.Fprintf(w, "lab: %d runs in %.0f s\n\n", len(res.Runs), time.Since(start).Seconds())
	return res, nil
}
