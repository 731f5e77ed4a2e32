// Command kvroute is the one kvroute binary: the simulated vLLM engine, the
// sidecar, the picker, and the bench, demo, inject and verify tools, each a
// subcommand.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// Exit codes (README, "Exit codes"; --help).
const (
	exitOK    = 0
	exitError = 1 // the command failed starting or running: a port in use, a file it cannot read, a peer it cannot reach, a check that failed
	exitUsage = 2 // bad usage: an unknown subcommand or flag, a flag value or combination the settings refuse
)

// exitCodesHelp is --help's account of the exit codes.
const exitCodesHelp = `Exit codes: 0 done (a server stopped by SIGINT or SIGTERM); 1 failed
starting or running (a port in use, a file that cannot be read, a peer not
reached, a check that failed); 2 bad usage (an unknown subcommand or flag,
a flag value or combination refused, before anything starts).`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// exitCodeError carries an exit code through cobra.
type exitCodeError struct {
	code int
	err  error
}

func (e *exitCodeError) Error() string { return e.err.Error() }

// run executes the command line and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCommand(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "kvroute: %v\n", err)
	var ec *exitCodeError
	if errors.As(err, &ec) {
		return ec.code
	}
	// Errors a subcommand's RunE returns are marked (runFailures); the rest
	// are cobra's own, usage errors: an unknown command or flag, a flag
	// value that does not parse, arguments where none are taken.
	return exitUsage
}

// runFailures makes every error a command's RunE returns a failure (exit
// 1) unless it is marked already (usageError): so a RunE marks its usage
// errors, and whatever fails once it starts (binding a port, reading a
// file, reaching a peer) exits 1 without a mark.
func runFailures(c *cobra.Command) {
	for _, sub := range c.Commands() {
		runFailures(sub)
	}
	if c.RunE == nil {
		return
	}
	runE := c.RunE
	c.RunE = func(cmd *cobra.Command, args []string) error {
		err := runE(cmd, args)
		var ec *exitCodeError
		if err != nil && !errors.As(err, &ec) {
			return startError(err)
		}
		return err
	}
}

// usageError marks bad usage: exit code 2. An error marked already
// (startError) keeps its mark.
func usageError(err error) error {
	var ec *exitCodeError
	if errors.As(err, &ec) {
		return err
	}
	return &exitCodeError{code: exitUsage, err: fmt.Errorf("%s", strings.TrimSpace(err.Error()))}
}

// startError marks a failure to start or run: exit code 1, also where a
// usage error would otherwise be assumed (a settings step that reads a
// file).
func startError(err error) error {
	return &exitCodeError{code: exitError, err: err}
}

func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "kvroute",
		Short: "KV-cache-aware request routing for vLLM fleets",
		Long: `kvroute routes each request to the vLLM endpoint that already holds the
longest cached prefix of it, without overloading anyone.

A sidecar beside each vLLM pod turns the engine's KV-cache events into a
compact summary; pickers receive the summaries, tokenize requests exactly as
the engine does, and pick. Canonical key format: ` + blockkey.FormatV1 + `.

` + exitCodesHelp,
		Version:       version + " (keys " + blockkey.FormatV1 + ")",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(
		newEngineCommand(),
		newSidecarCommand(),
		newPickerCommand(),
		newBenchCommand(),
		newLabCommand(),
		newDemoCommand(),
		newInjectCommand(),
		newVerifyCommand(),
	)
	runFailures(root)
	return root
}

func newSidecarCommand() *cobra.Command {
	cmd, _, _ := sidecarCommand()
	return cmd
}
