package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
)

// loadCmd is `sluice load`: the load generator is a binary of its own,
// sluice-load (built by `make build` beside sluice, and shipped in the
// release archives), so that the service's module holds only what the
// service imports. `sluice load ARGS` runs it with ARGS, as git runs its
// external commands.
type loadCmd struct {
	Args []string `arg:"" optional:"" passthrough:"" help:"sluice-load's flags (sluice load --help lists them)"`
}

// loadBinary is the load generator's name.
const loadBinary = "sluice-load"

// loadMissing is what `sluice load` says when it finds no sluice-load.
const loadMissing = `sluice load runs the load generator, sluice-load, a binary of its own,
looked for beside sluice and then on PATH; neither has it. Build it with
"make build" (it goes to bin/ beside sluice), or with
"cd bench && go build -o ../bin/sluice-load ./cmd/sluice-load", or take it
from a release archive. Its flags are the same as "sluice load" had.`

func (c *loadCmd) run(inv *invocation) int {
	path := findLoad(inv.getenv)
	if path == "" {
		fmt.Fprintln(inv.stderr, loadMissing)
		if len(c.Args) == 0 || slices.Contains([]string{"-h", "-help", "--help"}, c.Args[0]) {
			return 0 // asked for help: this is it
		}
		return 2
	}
	cmd := exec.Command(path, c.Args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inv.stdin, inv.stdout, inv.stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode()
	default:
		fmt.Fprintf(inv.stderr, "sluice load: %v\n", err)
		return 3
	}
}

// findLoad returns the path of sluice-load: beside the running sluice
// first (a build or release puts them together), then on PATH; "" when
// there is none.
func findLoad(getenv func(string) string) string {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), loadBinary)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	for _, dir := range filepath.SplitList(getenv("PATH")) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, loadBinary)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}
