package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/bench"
	"github.com/kvroute/kvroute/picker/score"
)

// scenarios are the bench scenarios built so far.
func scenarios() map[string]bench.Scenario {
	return map[string]bench.Scenario{"seed-continuation": bench.SeedContinuation{}}
}

func newBenchCommand() *cobra.Command {
	var scenario, policies, out, logLevel string
	var engines int
	var timeScale float64
	var seed uint64
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run a routing benchmark scenario and write a report",
		Long: `Run a scenario against a fleet of simulated engines (kvroute engine), a
sidecar each and a picker, all over real sockets on 127.0.0.1 in this
process, once per routing policy with a fresh fleet each; print the table and
write DIR/results.json and DIR/summary.txt.

Scenarios: seed-continuation (2 engines, 12 two-turn Responses conversations
run one after another as agentic-api runs them, ≈ 6.6k tokens on turn 2, a
fresh cache_salt each). The agentic-pressure, shared-prefix and trace
scenarios, and report.html, are not built yet.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, ok := scenarios()[scenario]
			if !ok {
				return usageError(fmt.Errorf("--scenario %q: not available; built so far: seed-continuation", scenario))
			}
			var ps []score.Policy
			for _, name := range strings.Split(policies, ",") {
				p, err := score.ParsePolicy(strings.TrimSpace(name))
				if err != nil {
					return usageError(fmt.Errorf("--policies: %w", err))
				}
				ps = append(ps, p)
			}
			if out == "" {
				return usageError(fmt.Errorf("--out DIR is required"))
			}
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
			fmt.Fprintf(w, "bench %s: policies %s, time scale %g, seed %d\n", scenario, policies, timeScale, seed)
			res, err := bench.Run(ctx, bench.Options{Scenario: sc, Policies: ps, Engines: engines, TimeScale: timeScale, Seed: seed, Log: log,
				Progress: progress(w, isTerminal(w))})
			if err != nil {
				return err
			}
			table, err := bench.Write(out, res)
			if err != nil {
				return err
			}
			fmt.Fprint(w, "\n"+table)
			fmt.Fprintf(w, "\nwrote %s and %s\n", out+string(os.PathSeparator)+"results.json", out+string(os.PathSeparator)+"summary.txt")
			for _, p := range res.Order {
				if res.Policies[p].Errors > 0 {
					return fmt.Errorf("%s: %d requests failed", p, res.Policies[p].Errors)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&scenario, "scenario", "seed-continuation", "scenario to run")
	f.StringVar(&policies, "policies", "round-robin,least-loaded,prefix-hash,precise", "policies to compare, comma-separated")
	f.IntVar(&engines, "engines", 0, "engines in the fleet (default: the scenario's)")
	f.Float64Var(&timeScale, "time-scale", 1, "simulated engine time: 1 real time, 0.1 ten times faster, 0 no waiting")
	f.Uint64Var(&seed, "seed", 1, "workload seed")
	f.StringVar(&out, "out", "", "directory for results.json and summary.txt")
	f.StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	return cmd
}

// progress reports requests done per policy: a line redrawn in place on a
// terminal, otherwise a plain line every 10 requests and at each policy's
// end.
func progress(w io.Writer, tty bool) func(policy string, done int) {
	var mu sync.Mutex
	last := 0
	return func(policy string, done int) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case done < 0 && tty:
			fmt.Fprintf(w, "\r%-13s %5d requests, done\n", policy, last)
			last = 0
		case done < 0:
			fmt.Fprintf(w, "%s: %d requests, done\n", policy, last)
			last = 0
		case tty:
			last = done
			fmt.Fprintf(w, "\r%-13s %5d requests", policy, done)
		default:
			last = done
			if done%10 == 0 {
				fmt.Fprintf(w, "%s: %d requests\n", policy, done)
			}
		}
	}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
