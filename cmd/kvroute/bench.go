package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/picker/admit"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/bench"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/workload"
)

// benchFlags are the settings of one bench run.
type benchFlags struct {
	scenario, trace, policies, out, logLevel     string
	engines, gpuBlocks, cpuBlocks, limit         int
	pickers                                      int
	timeScale, traceRate, epsilon                float64
	seed                                         uint64
	sequential, peers, admission, enginePriority bool
	duration, faultGap, faultWarmup              time.Duration
	faults, profile                              string
	prefillTokens                                float64
}

// scenario builds the named scenario from the flags.
func (b *benchFlags) buildScenario() (bench.Scenario, error) {
	if b.sequential && b.scenario != "seed-continuation" {
		return nil, fmt.Errorf("--sequential is a form of --scenario seed-continuation, not of %s", b.scenario)
	}
	switch b.scenario {
	case "seed-continuation":
		if b.sequential {
			return bench.SeedContinuation{}, nil
		}
		return bench.SeedConcurrent{}, nil
	case "agentic-pressure":
		return bench.Plan(workload.AgenticPressure{}, b.seed, 1), nil
	case "agentic-chat":
		return bench.Plan(workload.AgenticChat(), b.seed, 1), nil
	case "demo":
		return bench.Plan(workload.Demo(), b.seed, 1), nil
	case "shared-prefix":
		return bench.SharedPrefix{}, nil
	case "overload":
		return bench.Overload(), nil
	case "tenants":
		return bench.Tenants(), nil
	case "trace":
		if b.trace == "" {
			return nil, fmt.Errorf("--scenario trace needs --trace FILE (a Mooncake-format JSONL file)")
		}
		if _, err := os.Stat(b.trace); err != nil {
			return nil, startError(fmt.Errorf("--trace: %w", err))
		}
		if b.traceRate <= 0 {
			return nil, fmt.Errorf("--trace-rate %v: want > 0", b.traceRate)
		}
		if b.limit < 0 {
			return nil, fmt.Errorf("--limit %d: want ≥ 0", b.limit)
		}
		return bench.Plan(workload.Trace{Path: b.trace, Limit: b.limit}, b.seed, b.traceRate), nil
	}
	if sc, err := workload.Named(b.scenario, workload.NamedOptions{}); err == nil {
		return bench.Plan(sc, b.seed, 1), nil
	}
	return nil, fmt.Errorf("--scenario %q: want seed-continuation, agentic-pressure, agentic-chat, demo, shared-prefix, trace, b2b-saas, hot-prefix, coding-agent, uniform-pool, doc-qa, hot-set, tiered-eviction, faults, overload or tenants", b.scenario)
}

func newBenchCommand() *cobra.Command {
	var b benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run a routing benchmark scenario and write a report",
		Long: `Run a scenario against a fleet of simulated engines (kvroute engine), a
sidecar each and a picker, all over real sockets on 127.0.0.1 in this
process, once per routing policy with a fresh fleet each; print the table and
write DIR/results.json, DIR/summary.txt and DIR/report.html.

Policies (--policies, comma-separated): kvroute's own — precise,
prefix-hash, least-loaded, round-robin — and the peers' routing,
re-implemented in the picker as baselines — llm-d, llm-d-calibrated,
llm-d-precise, dynamo, sglang. llm-d runs its load gate at the guide's
values (15,928 prompt tokens/s, measured on H100s, × 18 s);
llm-d-calibrated first measures the peak prefill throughput of its own
engines by llm-d's recipe (5 warm-up then 20 completions of exactly
max_num_batched_tokens random token ids, through the picker; peak = chunk ÷
median TTFT) and runs with it and 18 s; the measured peak is in
results.json and the tables. --peers is shorthand for the peers, precise
and round-robin:
  --policies ` + peersShorthand + `
When a peer ran, every policy is also set against the best peer: its hit
rate, mean TTFT and p99 TTFT ÷ the best peer's (results.json vs_best_peer,
summary.txt, report.html). llm-d counts once there: the stronger of its two
runs on mean TTFT, named. On a scenario that sends /v1/responses,
llm-d-precise is labelled "llm-d-precise (given tokens)": upstream llm-d
cannot tokenize Responses requests, the picker hands it exact tokens.

Admission control is off (--admission to turn it on): a comparison
measures routing alone, since admission rescues load-blind policies and
drops its 429s from the TTFTs. With --admission, the picker's defaults (or
--saturation-prefill-tokens) apply to every policy and each policy's 429s
are reported beside its figures. The overload and tenants scenarios, which
test admission, run with it unless --admission=false.

Scenarios:
  seed-continuation  4 engines × 3,072 blocks, 64 of the seed run's two-turn
                     agentic Responses conversations at once, interleaved
                     (1.25 start a second): turn 1 ≈ 6.8k tokens (system
                     prompt, tools, task), then a tool call and its
                     32–128-token output, and turn 2 the whole conversation
                     rehydrated; a fresh cache_salt each; working set ≈ 2.3×
                     the fleet's KV, 9× one engine's. Reports the
                     continuation hit and warm returns against chance (1 ÷
                     engines). With --sequential, the seed run as it was: 2
                     engines, 12 conversations one after another.
  agentic-pressure   8 engines, 64 concurrent agent sessions of 4 agent types
                     (2k–6k-token system prompts with tools), 5–20 tool-call
                     turns with 200–2,000-token outputs, branches, 4 tenants
                     with their own salts; working set ≈ 1.7× the fleet's KV.
  agentic-chat       agentic-pressure's conversations (the same for a seed)
                     sent to /v1/chat/completions: the whole message history
                     each turn, tools in chat form, tool calls and tool
                     messages.
  demo               kvroute demo's workload: 4 engines, 16 agent sessions of
                     4 types, 4–8 tool-call turns, 2 tenants.
  shared-prefix      8 engines, 150 customers × 6,000-token prefix, 5 users
                     each with a 1,200-token question, QPS stepped 3, 6, 10,
                     15, 20 for 30 s each; working set ≈ 73% of the fleet's
                     KV.
  trace              replay of a Mooncake JSONL trace (--trace FILE) as
                     token-id prompts, each hash id a fixed run of 512 tokens,
                     on 8 engines of 65,536 blocks (--limit N: the first N
                     records; --trace-rate R: R times the trace's rate).
                     The seed is the workload's: --seed 0 replays the trace
                     as recorded; another seed keeps 80% of its
                     conversations, jitters arrivals by up to half the mean
                     gap and salts the token runs, a different workload.
  b2b-saas, hot-prefix, coding-agent, uniform-pool, doc-qa, hot-set, tiered-eviction
                     the lab's scenarios (kvroute lab --help), on the real
                     clock: the same plans, seeds and bytes.
  overload           2 engines, streaming completions (a 256-token shared
                     prefix, 2,000 uncached tokens, 8 out) at 0.5× the fleet's
                     prefill-bound capacity for 30 s, 4× for 60 s, 0.5× for
                     20 s; the client never retries. Per phase: answered,
                     429s (with Retry-After or not), 5xx, other failures, and
                     the answered requests' TTFT — admission control's test.
  tenants            the same requests from a light tenant at 0.25× alone for
                     30 s, then beside a heavy one at 2.5× (10×) for 60 s,
                     each named by x-kvroute-tenant: fair queuing's test (the
                     light tenant's p99 TTFT contended ÷ alone).

  faults             real processes, not in-process: 4 kvroute engine, a
                     kvroute sidecar each and 2 kvroute picker processes (this
                     binary) on 127.0.0.1 with memberlist gossip; 8 agent
                     sessions at a time (the demo's shape, a new session as
                     one ends) sent round-robin over the two pickers by a
                     client that follows their /readyz, as a Service does,
                     and retries only a refused connection. After
                     --fault-warmup it injects, --fault-gap apart (--faults
                     picks and orders them): engine-sigkill (restarted on its
                     port), engine-sigstop (SIGCONT after 5 s),
                     reset-prefix-cache, event-loss (10% of event batches
                     dropped for 20 s, replay on), sidecar-sigkill (restarted),
                     picker-sigterm (a drain), picker-sigkill (restarted),
                     gossip-partition (one sidecar cut off gossip ≥ 10 s).
                     Per fault: requests failed by the router and unavoidable
                     ones (in flight on the killed or stopped process), the
                     hit rate 30 s before and after, the recovery time, the
                     pickers' predicted-vs-reported outcomes after it. Time
                     scale 0.5 unless --time-scale is given: about 4 minutes.
                     Fails when the router failed a request.

--pickers N runs N pickers over each fleet (in process, each with its own
HTTP, admin, gRPC and bookings listeners, metrics and state — peer policies
keep one per replica, as in their own systems — and every picker's
bookings address to exchange bookings with, as --peer-pickers); the client sends each request, a conversation's
turns each on its own, to one of them drawn at random from --seed, as a
Kubernetes Service spreads them. The pickers' decisions, outcomes and
overhead are summed; results.json has per policy "picker_requests" and
fleet "pickers". Every policy reports "load_cv" beside "load_imbalance":
the answered requests per engine's standard deviation ÷ their mean.

--duration D runs each policy for D of wall time: the scenario repeats (a
new seed stream each time) until D, requests cut at D are left out; memory
and goroutines are sampled every 2 s into results.json (resources) and the
report, with their growth (first against last minute). In-process fleets
give the bench process's own figures; --scenario faults gives each picker's
and sidecar's (VmRSS, go_goroutines from /metrics), and with --faults none
it is a steady soak of the process fleet.

DIR/requests.jsonl lists every request (policy, conversation, turn, engine,
TTFT, prompt and cached tokens; no prompt text).

Latencies are reported in simulated engine time: --time-scale 0.5 runs twice
as fast as real time with the same figures, as long as this machine keeps up.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if b.duration < 0 {
				return usageError(fmt.Errorf("--duration %v: want > 0 (or 0: the scenario once)", b.duration))
			}
			if b.scenario == "faults" {
				return b.runFaults(cmd)
			}
			for _, name := range []string{"faults", "fault-gap", "fault-warmup"} {
				if cmd.Flags().Changed(name) {
					return usageError(fmt.Errorf("--%s is for --scenario faults", name))
				}
			}
			sc, err := b.buildScenario()
			if err != nil {
				return usageError(err)
			}
			if b.profile != "" { // "": the scenario's
				if _, err := profile.Named(b.profile); err != nil {
					return usageError(fmt.Errorf("--profile: %w", err))
				}
			}
			ps, err := b.policyList(cmd.Flags().Changed("policies"))
			if err != nil {
				return usageError(err)
			}
			switch {
			case b.out == "":
				return usageError(fmt.Errorf("--out DIR is required"))
			case b.timeScale < 0:
				return usageError(fmt.Errorf("--time-scale %v: want ≥ 0", b.timeScale))
			case b.engines < 0 || b.gpuBlocks < 0:
				return usageError(fmt.Errorf("--engines and --gpu-blocks must not be negative"))
			case b.pickers < 1:
				return usageError(fmt.Errorf("--pickers %d: want ≥ 1", b.pickers))
			}
			log, err := newLogger(b.logLevel)
			if err != nil {
				return usageError(err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			w := cmd.OutOrStdout()
			admission := b.admissionOn(cmd.Flags().Changed("admission"))
			fmt.Fprintf(w, "bench %s: policies %s, time scale %g, seed %d, admission control %s\n", sc.Name(), b.policies, b.timeScale, b.seed,
				map[bool]string{true: "on", false: "off"}[admission])
			if b.enginePriority {
				fmt.Fprintln(w, "engines schedule by priority; kvroute's pickers set it (--engine-priority)")
			}
			o := bench.Options{Scenario: sc, Policies: ps, Engines: b.engines, GPUBlocks: b.gpuBlocks, CPUBlocks: b.cpuBlocks,
				TimeScale: b.timeScale, Seed: b.seed, Log: log, Duration: b.duration, Admission: admission, Profile: b.profile, Pickers: b.pickers,
				EnginePriority: b.enginePriority}
			if cmd.Flags().Changed("load-epsilon") {
				if b.epsilon < 0 || b.epsilon > 100 {
					return usageError(fmt.Errorf("--load-epsilon %v: want 0..100", b.epsilon))
				}
				o.LoadEpsilon = &b.epsilon
			}
			if cmd.Flags().Changed("saturation-prefill-tokens") {
				if !o.Admission {
					return usageError(fmt.Errorf("--saturation-prefill-tokens is admission's limit: give --admission too"))
				}
				if !(b.prefillTokens >= 0) {
					return usageError(fmt.Errorf("--saturation-prefill-tokens %v: want a number of tokens, 0 to not check", b.prefillTokens))
				}
				o.SaturationPrefillTokens = &b.prefillTokens
			}
			return runBench(ctx, w, o, b.out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&b.scenario, "scenario", "seed-continuation", "scenario: seed-continuation, agentic-pressure, agentic-chat, demo, shared-prefix, trace, faults (real processes, a fault matrix), overload (4× capacity: admission) or tenants (a light tenant beside one sending 10×)")
	f.BoolVar(&b.sequential, "sequential", false, "with --scenario seed-continuation: its sequential form (2 engines, conversations one after another)")
	f.StringVar(&b.trace, "trace", "", "Mooncake-format JSONL file for --scenario trace")
	f.IntVar(&b.limit, "limit", 0, "replay only the trace's first N records (0: all)")
	f.Float64Var(&b.traceRate, "trace-rate", 1, "scale the trace's request rate (0.5: half the rate, for a smaller fleet)")
	f.StringVar(&b.policies, "policies", "round-robin,least-loaded,prefix-hash,precise", "policies to compare, comma-separated: kvroute's (precise, prefix-hash, least-loaded, round-robin) or peers' (llm-d, llm-d-calibrated, llm-d-precise, dynamo, sglang)")
	f.BoolVar(&b.peers, "peers", false, "shorthand for --policies "+peersShorthand)
	f.BoolVar(&b.admission, "admission", false, "run the picker's admission control (saturated groups queue, then shed 429s, reported per policy); "+
		"off by default so that policies are compared on routing alone, except for --scenario overload and tenants, admission's own tests")
	f.BoolVar(&b.enginePriority, "engine-priority", false, "run the engines with --scheduling-policy priority and kvroute's pickers with --engine-priority (a peer policy's picker sets no priority, as its own system does not: its requests run first come, first served)")
	f.IntVar(&b.engines, "engines", 0, "engines in the fleet (default: the scenario's)")
	f.IntVar(&b.gpuBlocks, "gpu-blocks", 0, "KV blocks of 16 tokens per engine (default: the scenario's)")
	f.IntVar(&b.pickers, "pickers", 1, "pickers sharing each fleet, each with its own state and listeners, told each other's bookings addresses (as --peer-pickers); the client sends each request to one drawn at random (from --seed), as a Service spreads them")
	f.IntVar(&b.cpuBlocks, "cpu-blocks", 0, "each engine's CPU offload tier in blocks of 16 tokens, with vLLM's P2P tier (0: the scenario's; -1: none)")
	f.Float64Var(&b.timeScale, "time-scale", 1, "simulated engine time: 1 real time, 0.1 ten times faster, 0 no waiting")
	f.Float64Var(&b.epsilon, "load-epsilon", score.DefaultConfig().Epsilon, "the picker's bounded-load factor ε (as kvroute picker --load-epsilon)")
	f.Float64Var(&b.prefillTokens, "saturation-prefill-tokens", admit.DefaultConfig().MaxPrefillTokens, "with --admission: the picker's admission limit on prefill tokens in flight per endpoint (as kvroute picker --saturation-prefill-tokens)")
	f.Uint64Var(&b.seed, "seed", 1, "workload seed")
	f.StringVar(&b.profile, "profile", "", "the engines' latency profile (default: the scenario's, else "+profile.SimDefault+"): "+strings.Join(profile.Names(), ", "))
	f.StringVar(&b.out, "out", "", "directory for results.json, summary.txt and report.html")
	f.StringVar(&b.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	f.DurationVar(&b.duration, "duration", 0, "run for this long (wall time, each policy): the scenario repeats until then, requests in flight at the end are left out; picker and sidecar memory and goroutines are sampled for soak figures (0: the scenario once)")
	f.StringVar(&b.faults, "faults", strings.Join(bench.FaultNames, ","), "with --scenario faults: the faults to inject, in this order, comma-separated; none: no fault (a steady run of the process fleet, e.g. a soak)")
	f.DurationVar(&b.faultGap, "fault-gap", 45*time.Second, "with --scenario faults: load (scenario time) after each fault is undone before the next, and after the last")
	f.DurationVar(&b.faultWarmup, "fault-warmup", 40*time.Second, "with --scenario faults: load (scenario time) before the first fault")
	return cmd
}

// faultsTimeScale is --scenario faults' time scale when --time-scale is
// not given: twice real time, so the default schedule takes about five
// minutes.
const faultsTimeScale = 0.5

// runFaults runs --scenario faults.
func (b *benchFlags) runFaults(cmd *cobra.Command) error {
	fl := cmd.Flags()
	for _, name := range []string{"sequential", "trace", "limit", "trace-rate", "peers", "load-epsilon", "saturation-prefill-tokens", "admission", "pickers", "engine-priority"} {
		if fl.Changed(name) {
			return usageError(fmt.Errorf("--%s is not for --scenario faults", name))
		}
	}
	if fl.Changed("policies") && b.policies != "precise" {
		return usageError(fmt.Errorf("--scenario faults runs the precise policy only (--policies %s)", b.policies))
	}
	switch {
	case b.out == "":
		return usageError(fmt.Errorf("--out DIR is required"))
	case b.timeScale < 0:
		return usageError(fmt.Errorf("--time-scale %v: want ≥ 0", b.timeScale))
	case b.engines != 0 && b.engines < 4:
		return usageError(fmt.Errorf("--engines %d: the faults scenario needs at least 4", b.engines))
	case b.gpuBlocks < 0:
		return usageError(fmt.Errorf("--gpu-blocks must not be negative"))
	case b.faultGap <= 0 || b.faultWarmup < 0:
		return usageError(fmt.Errorf("--fault-gap %v, --fault-warmup %v: want > 0 and ≥ 0", b.faultGap, b.faultWarmup))
	}
	faults := []string{}
	if b.faults != "none" && b.faults != "" {
		for _, name := range strings.Split(b.faults, ",") {
			name = strings.TrimSpace(name)
			if !slices.Contains(bench.FaultNames, name) {
				return usageError(fmt.Errorf("--faults: %q: want %s, or none", name, strings.Join(bench.FaultNames, ", ")))
			}
			if slices.Contains(faults, name) {
				return usageError(fmt.Errorf("--faults: %s twice", name))
			}
			faults = append(faults, name)
		}
	}
	scale := b.timeScale
	if !fl.Changed("time-scale") {
		scale = faultsTimeScale
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "bench faults: %s; time scale %g, seed %d; real processes (engines, sidecars, pickers) on 127.0.0.1\n",
		cmp.Or(strings.Join(faults, ", "), "no faults"), scale, b.seed)
	o := bench.Options{Engines: b.engines, GPUBlocks: b.gpuBlocks, TimeScale: scale, Seed: b.seed, Progress: progress(w, isTerminal(w))}
	res, err := bench.RunFaults(ctx, o, bench.FaultsOptions{Faults: faults, Gap: b.faultGap, Warmup: b.faultWarmup, Duration: b.duration,
		LogDir: filepath.Join(b.out, "logs")})
	if err != nil {
		return err
	}
	table, err := bench.Write(b.out, res)
	if err != nil {
		return err
	}
	fmt.Fprint(w, "\n"+table)
	fmt.Fprintf(w, "\nwrote %s, results.json, summary.txt, requests.jsonl and the processes' logs (logs/) in %s\n", filepath.Join(b.out, "report.html"), b.out)
	if n := res.Faults.RouterFailed; n > 0 {
		return fmt.Errorf("%d requests failed by the router (results.json faults: failure_samples)", n)
	}
	return nil
}

// peersShorthand is what --peers stands for: the peers' policies (llm-d
// twice: at the guide's load gate, then calibrated), then kvroute's
// precise and round-robin.
var peersShorthand = func() string {
	var names []string
	for _, p := range append(score.PeerPolicies(), score.Precise, score.RoundRobin) {
		names = append(names, string(p))
		if p == score.LLMD {
			names = append(names, string(bench.LLMDCalibrated))
		}
	}
	return strings.Join(names, ",")
}()

// admissionScenarios are the scenarios that test admission control: they
// run with it unless --admission=false.
var admissionScenarios = []string{"overload", "tenants"}

// admissionOn is whether the run has admission control: --admission as
// given, else on for admission's own scenarios only.
func (b *benchFlags) admissionOn(given bool) bool {
	if given {
		return b.admission
	}
	return slices.Contains(admissionScenarios, b.scenario)
}

// policyList is the policies to run: --policies, or what --peers stands
// for (not both; policiesSet says whether --policies was given).
func (b *benchFlags) policyList(policiesSet bool) ([]score.Policy, error) {
	if b.peers {
		if policiesSet {
			return nil, fmt.Errorf("--peers is shorthand for --policies %s: give one of them", peersShorthand)
		}
		b.policies = peersShorthand
	}
	return parsePolicies(b.policies)
}

// parsePolicies parses a comma-separated policy list: the picker's
// policies and the bench's llm-d-calibrated.
func parsePolicies(s string) ([]score.Policy, error) {
	var ps []score.Policy
	for _, name := range strings.Split(s, ",") {
		p, err := score.Policy(strings.TrimSpace(name)), error(nil)
		if p != bench.LLMDCalibrated {
			p, err = score.ParsePolicy(string(p))
		}
		if err != nil {
			return nil, fmt.Errorf("--policies: %w (or %s)", err, bench.LLMDCalibrated)
		}
		if slices.Contains(ps, p) {
			return nil, fmt.Errorf("--policies: %s twice", p)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// runBench runs o with progress on w, writes the results to out, prints the
// table, and fails if any request failed: with admission on, its 429s are
// answers, reported, not failures.
func runBench(ctx context.Context, w io.Writer, o bench.Options, out string) error {
	o.Progress = progress(w, isTerminal(w))
	res, err := bench.Run(ctx, o)
	if err != nil {
		return err
	}
	table, err := bench.Write(out, res)
	if err != nil {
		return err
	}
	fmt.Fprint(w, "\n"+table)
	fmt.Fprintf(w, "\nwrote %s (open it in a browser), results.json, summary.txt and requests.jsonl in %s\n", filepath.Join(out, "report.html"), out)
	var failed []string
	for _, p := range res.Order {
		pr := res.Policies[p]
		if len(pr.Phases) > 0 {
			// Shedding is the phased scenarios' point: only a 5xx, a 429
			// without Retry-After or another failure is one.
			for _, x := range pr.Phases {
				if n := x.ServerErrors + x.OtherErrors + x.Shed - x.ShedWithRetryAfter; n > 0 {
					failed = append(failed, fmt.Sprintf("%s: %s, %s: %d requests failed (5xx %d, 429 without Retry-After %d, other %d; %s)", p, x.Phase, x.Tenant, n,
						x.ServerErrors, x.Shed-x.ShedWithRetryAfter, x.OtherErrors, strings.Join(pr.ErrorSamples, "; ")))
				}
			}
			continue
		}
		n := pr.Errors
		if pr.Shed429 != nil {
			n -= *pr.Shed429
		}
		if n > 0 {
			failed = append(failed, fmt.Sprintf("%s: %d of %d requests failed (%s)", p, n, pr.Requests,
				strings.Join(pr.ErrorSamples, "; ")))
		}
	}
	if len(failed) > 0 {
		sort.Strings(failed)
		return fmt.Errorf("%s", strings.Join(failed, "; "))
	}
	return nil
}

// progress reports requests done per policy: a line redrawn in place on a
// terminal, otherwise a plain line every 25 requests and at each policy's
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
			last = max(last, done) // calls may arrive out of order
			fmt.Fprintf(w, "\r%-13s %5d requests", policy, last)
		default:
			last = max(last, done)
			if done%25 == 0 {
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
