// Command kvroute is the one kvroute binary: the simulated vLLM engine, the
// sidecar, the picker, and the bench, demo, inject and verify tools, each a
// subcommand.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed
	exitUsage = 2 // bad usage, or a subcommand that does not exist yet
)

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
	// cobra's own errors are usage errors: unknown command or flag, bad args.
	return exitUsage
}

func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "kvroute",
		Short: "KV-cache-aware request routing for vLLM fleets",
		Long: `kvroute routes each request to the vLLM endpoint that already holds the
longest cached prefix of it, without overloading anyone.

A sidecar beside each vLLM pod turns the engine's KV-cache events into a
compact summary; pickers receive the summaries, tokenize requests exactly as
the engine does, and pick. Canonical key format: ` + blockkey.FormatV1 + `.`,
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
	return root
}

func newSidecarCommand() *cobra.Command {
	cmd, _, _ := sidecarCommand()
	return cmd
}
