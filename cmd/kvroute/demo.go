package main

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/bench"
)

func newDemoCommand() *cobra.Command {
	var out, logLevel, listen string
	var keep bool
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
			sc := bench.Demo()
			fmt.Fprintf(w, "kvroute demo: %d engines, a sidecar each and a picker on 127.0.0.1; %s; policies round-robin, least-loaded, prefix-hash, precise\n",
				sc.Engines, sc.Name())
			if err := runBench(ctx, w, bench.Options{Scenario: sc, Policies: []score.Policy{score.RoundRobin, score.LeastLoaded, score.PrefixHash, score.Precise}, TimeScale: timeScale, Seed: seed, Log: log}, out); err != nil {
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
	f.StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	return cmd
}
