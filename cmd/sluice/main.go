// Command sluice is the Sluice rate limiter's one binary.
//
//	sluice serve [flags]            serve the HTTP, gRPC and Envoy APIs
//	sluice config validate PATH     check a configuration file or directory
//	sluice check [flags]            ask a running server for one decision
//	sluice admin COMMAND [flags]    use the admin API of a running server
//	sluice migrate --analytics URL  migrate the analytics' PostgreSQL
//	sluice load [flags]             run the load generator, sluice-load
//	sluice version                  print the build's version and commit
//	sluice completion SHELL         print a completion script (bash, zsh, fish)
//
// Every flag has a matching SLUICE_* environment variable (the flag wins):
// SLUICE_FLAG for serve's, SLUICE_COMMAND_FLAG for the other commands'.
// Run `sluice --help` or `sluice COMMAND --help` for the flags.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/alecthomas/kong"

	"github.com/sluicehq/sluice/internal/buildinfo"
	"github.com/sluicehq/sluice/internal/policy"
)

func main() {
	inv := &invocation{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	os.Exit(inv.run(os.Args[1:]))
}

// cli is sluice's command line: a field per command.
type cli struct {
	Serve      serveCmd      `cmd:"" help:"Serve the HTTP, gRPC and Envoy rate limit APIs."`
	Config     configCmd     `cmd:"" help:"Check configuration files or directories."`
	Check      checkCmd      `cmd:"" help:"Ask a running server for one decision (HTTP or Envoy's API)."`
	Admin      adminCmd      `cmd:"" help:"Change rules, tiers, overrides, throttles and tokens through the admin API."`
	Migrate    migrateCmd    `cmd:"" help:"Bring the analytics schema of a PostgreSQL to this build's version."`
	Load       loadCmd       `cmd:"" passthrough:"" help:"Drive a running server with checks (runs sluice-load, a binary of its own)."`
	Version    versionCmd    `cmd:"" help:"Print the version, commit, build date and Go version (also --version)."`
	Completion completionCmd `cmd:"" help:"Print a shell completion script (bash, zsh or fish)."`
}

const rootHelp = `Sluice, a rate limiter. Every flag has a SLUICE_* environment variable,
read when the flag is not given: SLUICE_FLAG for serve's flags,
SLUICE_COMMAND_FLAG for the other commands'. Run "sluice COMMAND --help"
for a command's flags, "sluice --version" for the build.`

// invocation is one run of the command line: its input and outputs, its
// environment and, once parsed, the command line itself.
type invocation struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	cli    *cli
	ctx    *kong.Context
}

// command is a command that runs: it returns the exit code.
type command interface {
	run(inv *invocation) int
}

// run runs the command line args and returns the exit code: 0 after --help
// or --version, 2 for a command line that does not parse or a value a flag
// cannot take, else the command's.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	inv := &invocation{stdin: os.Stdin, stdout: stdout, stderr: stderr, getenv: getenv}
	return inv.run(args)
}

func (inv *invocation) run(args []string) int {
	args = longDashes(args)
	switch {
	case len(args) > 0 && args[0] == "help":
		args = append(args[1:], "--help")
	case len(args) == 1 && args[0] == "--version":
		args = []string{"version"}
	}
	exit := -1
	inv.cli = &cli{}
	k, err := newParser(inv.cli, inv.stdout, inv.stderr, inv.getenv, func(code int) {
		if exit < 0 {
			exit = code
		}
	})
	if err != nil {
		fmt.Fprintf(inv.stderr, "sluice: %v\n", err)
		return 2
	}
	inv.ctx, err = k.Parse(args)
	if exit >= 0 { // --help was printed; what follows it does not matter
		return exit
	}
	if err != nil {
		return inv.parseError(k, err)
	}
	if err := checkURLFlags(inv.ctx); err != nil {
		fmt.Fprintf(inv.stderr, "%s: %v\n", inv.name(), err)
		return 2
	}
	cmd, ok := inv.ctx.Selected().Target.Addr().Interface().(command)
	if !ok {
		fmt.Fprintf(inv.stderr, "%s: not a command\n", inv.name())
		return 2
	}
	return cmd.run(inv)
}

// parseError prints err, an error of parsing the command line, and returns
// 2. A value a flag cannot take is told with what the flag wants; other
// errors (an unknown flag or command, a missing argument) come after the
// command's usage.
func (inv *invocation) parseError(k *kong.Kong, err error) int {
	var pe *kong.ParseError
	if errors.As(err, &pe) {
		inv.ctx = pe.Context
	}
	name := inv.name()
	var ee *envError
	var ve *valueError
	switch {
	case errors.As(err, &ee):
		fmt.Fprintf(inv.stderr, "%s: %v\n", name, ee)
	case errors.As(err, &ve):
		fmt.Fprintf(inv.stderr, "%s: %v\nRun \"%s --help\" for the flags.\n", name, err, name)
	default:
		if inv.ctx != nil {
			k.Stdout = inv.stderr
			_ = inv.ctx.PrintUsage(false)
			fmt.Fprintln(inv.stderr)
		}
		fmt.Fprintf(inv.stderr, "%s: %v\n", name, err)
	}
	return 2
}

// name returns the words of the command being run: "sluice admin rules".
func (inv *invocation) name() string {
	if inv.ctx == nil || inv.ctx.Selected() == nil {
		return "sluice"
	}
	return inv.ctx.Selected().FullPath()
}

// usageError prints msg about the command line and the command's usage,
// and returns 2.
func (inv *invocation) usageError(format string, args ...any) int {
	fmt.Fprintf(inv.stderr, "%s: %s\n", inv.name(), fmt.Sprintf(format, args...))
	fmt.Fprintf(inv.stderr, "Run \"%s --help\" for the usage.\n", inv.name())
	return 2
}

type versionCmd struct{}

func (versionCmd) run(inv *invocation) int {
	fmt.Fprintln(inv.stdout, buildinfo.Read())
	return 0
}

type configCmd struct {
	Validate validateCmd `cmd:"" help:"Check configuration files or directories; exit 1 at the first invalid one."`
}

type validateCmd struct {
	MergeDomainConfig bool     `name:"merge-domain-config" env:"SLUICE_MERGE_DOMAIN_CONFIG" help:"let several files of a directory hold one Envoy domain, merged (as serve's flag)"`
	Paths             []string `arg:"" name:"path" sep:"none" help:"a configuration file, or a directory of envoyproxy/ratelimit files"`
}

func (validateCmd) Help() string {
	return "Checks configuration files or directories and exits 1 at the first invalid one, naming the file and the field."
}

func (c *validateCmd) run(inv *invocation) int {
	for _, f := range c.Paths {
		p, err := policy.LoadWith(f, policy.Options{MergeDomains: c.MergeDomainConfig})
		if err != nil {
			var ce *policy.ConfigError
			if errors.As(err, &ce) || strings.HasPrefix(err.Error(), f) {
				fmt.Fprintln(inv.stderr, err)
			} else {
				fmt.Fprintf(inv.stderr, "%s: %v\n", f, err)
			}
			return 1
		}
		fmt.Fprintf(inv.stdout, "%s: valid (version %s)\n", f, p.Version)
	}
	return 0
}
