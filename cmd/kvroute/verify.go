package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/cmd/kvroute/collect"
	"github.com/kvroute/kvroute/deploy/monitoring"
	"github.com/kvroute/kvroute/internal/verify"
)

func newVerifyCommand() *cobra.Command {
	cfg := collect.DefaultConfig()
	var tokenFile string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "verify --picker URL",
		Short: "Check a fleet's compatibility and token parity",
		Long: `Check, through a picker, that the fleet's endpoints agree on what routing
keys depend on, and that the picker's predictions match what the engines
actually cache:

  - identity: per model, every endpoint's block size, hash algorithm, key
    format, summary parameters and tokenizer fingerprint against the
    model's majority; sidecars stale, partial or unreachable; engines that
    do not report cached tokens (--enable-prompt-tokens-details);
  - token parity: a chat request with tools, a text completion and a
    Responses request (instructions, a function call and its output), each
    sent twice with a fresh cache_salt: the second must go where the first
    went, the picker's predicted cached tokens must equal the engine's, the
    picker's block keys must be on that endpoint's sidecar, and another
    salt must share nothing; and each probe rendered by every endpoint of
    the model must give the picker's block keys (another tokenizer or chat
    template shows here even when the picker routes nothing to it);
  - sidecar stream: after the probes, each sidecar's verdict on its live KV
    event stream must be "live" — "silent", "replay_only", "partial" fail
    with the sidecar's reason (a sidecar in connect mode whose engine
    connects too needs --kv-events-mode bind), and so does "unknown" once
    the engine has served verify's requests;
  - endpoint picker: when the picker serves one (--ext-proc-listen), its
    grpc.health.v1 must answer SERVING for the ext_proc service at the
    address the picker reports (on --picker's host when it listens on every
    interface; --ext-proc to give another);
  - lag: per model, a completion under a fresh cache_salt sent straight to
    every engine the picker routes the model to, then the picker's
    decision API polled until it predicts the prompt's blocks on each: the
    time from the engine's answer to that prediction, printed, must not
    exceed --max-lag;
  - metrics served: the picker's admin port and each sidecar's must serve
    /metrics with every series the Grafana dashboard reads of that
    component (the dashboard built into this binary); a series missing is
    named.

The picker's endpoints and admission state are read on its admin port
(--picker-admin; default: --picker's host at port 8081); the probes go to
its public port (--picker).

Probes send small requests (a few hundred tokens, one output token) to the
engines, directly and through the picker. Exit status: 0 when every check
passed; 1 when one failed, or verify could not run (picker unreachable, a
file it cannot read); 2 on bad usage (flags).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := cfg.Validate(); err != nil {
				return usageError(err)
			}
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return startError(fmt.Errorf("--decision-token-file: %w", err))
				}
				cfg.Token = strings.TrimSpace(string(b))
			}
			c, err := collect.New(cfg)
			if err != nil {
				return usageError(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*cfg.Timeout)
			defer cancel()
			facts, err := c.Facts(ctx)
			if err == nil && ctx.Err() != nil {
				err = fmt.Errorf("ran out of time (10 × --timeout %v): raise --timeout", cfg.Timeout)
			}
			if err != nil {
				return startError(err) // verify itself could not run
			}
			lim := verify.DefaultLimits()
			lim.MaxLag = cfg.MaxLag
			// The series each admin port must serve: the dashboard's, as
			// built into this binary.
			if lim.Series, err = monitoring.Series(); err != nil {
				return startError(err)
			}
			rep := verify.Judge(facts, lim)
			w := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printVerify(w, &rep)
			}
			if !rep.OK {
				return &exitCodeError{code: exitError, err: errors.New(verify.Summary(rep.Checks))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Picker, "picker", "", "the picker's HTTP base URL, e.g. http://kvroute-picker:8080")
	f.StringVar(&cfg.Admin, "picker-admin", "", "the picker's admin base URL (its --admin-listen), where /debug/endpoints is (default: --picker's host at port 8081)")
	f.StringVar(&cfg.Model, "model", "", "check only this model (default: every model the picker routes)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on each request")
	f.DurationVar(&cfg.MaxLag, "max-lag", cfg.MaxLag, "longest event-to-routable lag the lag probe passes with")
	f.StringVar(&cfg.ExtProc, "ext-proc", "", "host:port the picker's endpoint picker (--ext-proc-listen) is reached at, for its gRPC health check (default: the address the picker reports, on --picker's host)")
	f.StringVar(&tokenFile, "decision-token-file", "", "file holding the picker's decision API token, if it needs one")
	return cmd
}

// printVerify writes the human report: the groups, a line per check, then
// the failures with their likely causes.
func printVerify(w io.Writer, rep *verify.Report) {
	fmt.Fprintf(w, "kvroute verify: picker %s, %d endpoint(s)\n\nidentity groups:\n", rep.Picker, len(rep.Fleet))
	for _, g := range rep.Groups {
		keys := make([]string, 0, len(g.Values))
		for k := range g.Values {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var vals []string
		for _, k := range keys {
			vals = append(vals, k+"="+g.Values[k])
		}
		fmt.Fprintf(w, "  %s: %d endpoint(s); %s\n", g.Model, len(g.Endpoints), strings.Join(vals, ", "))
	}
	fmt.Fprintln(w)
	for _, c := range rep.Checks {
		mark := "✔"
		if !c.OK {
			mark = "✘"
		}
		if c.Figure != "" {
			fmt.Fprintf(w, "%s %-40s %s  %s\n", mark, c.Name, c.Endpoint, c.Figure)
			continue
		}
		fmt.Fprintf(w, "%s %-40s %s\n", mark, c.Name, c.Endpoint)
	}
	if failed := verify.Failed(rep.Checks); len(failed) > 0 {
		fmt.Fprintln(w, "\nfailures:")
		for _, c := range failed {
			fmt.Fprintf(w, "✘ %s %s\n    %s\n    likely cause: %s\n", c.Name, c.Endpoint, c.Detail, c.Cause)
		}
	}
	fmt.Fprintf(w, "\n%s\n", verify.Summary(rep.Checks))
}
