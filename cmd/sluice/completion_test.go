package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The bash completion script is valid bash, names every command of the
// usage and every flag of serve, and completes what is typed.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash on this machine")
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"completion", "bash"}, &out, &errOut, noEnv); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	script := filepath.Join(t.TempDir(), "sluice.bash")
	os.WriteFile(script, out.Bytes(), 0o644)
	if msg, err := exec.Command(bash, "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v: %s", err, msg)
	}
	top := regexp.MustCompile(`(?m)^ +"" *\) words="([^"]*)"`).FindStringSubmatch(out.String())
	if top == nil {
		t.Fatalf("no top-level commands in the script:\n%s", out.String())
	}
	commands := strings.Fields(top[1])
	var help bytes.Buffer
	run([]string{"--help"}, &help, &errOut, noEnv)
	for _, m := range regexp.MustCompile(`(?m)^  ([a-z]+) `).FindAllStringSubmatch(help.String(), -1) {
		if !slices.Contains(commands, m[1]) {
			t.Errorf("the script's commands %q do not name %s", commands, m[1])
		}
	}
	help.Reset()
	run([]string{"serve", "--help"}, &help, &errOut, noEnv)
	flags := regexp.MustCompile(`(?m)^  (?:-\w, |    )?--([a-z][a-z0-9-]*)`).FindAllStringSubmatch(help.String(), -1)
	if len(flags) < 50 {
		t.Fatalf("%d flags read from serve --help:\n%s", len(flags), help.String())
	}
	for _, m := range flags {
		if m[1] == "help" {
			continue
		}
		if !strings.Contains(out.String(), "--"+m[1]+" ") && !strings.Contains(out.String(), "--"+m[1]+`"`) {
			t.Errorf("the script does not name serve's --%s", m[1])
		}
	}
	for _, tc := range []struct {
		line string // typed so far
		want string // the completions, space-separated
	}{
		{"sluice ad", "admin"},
		{"sluice admin ru", "rules"},
		{"sluice admin rules put --ver", "--version"},
		{"sluice admin rules get my-rule --to", "--token"},
		{"sluice serve --store-dead", "--store-deadline"},
		{"sluice check --target envoy --desc", "--descriptor"},
		{"sluice config ", "validate"},
		{"sluice completion f", "fish"},
		{"sluice admin throttle l", "list lift"},
		{"sluice check --tls-c", "--tls-ca --tls-client-cert --tls-client-key"},
	} {
		words := strings.Fields(tc.line)
		if strings.HasSuffix(tc.line, " ") {
			words = append(words, "")
		}
		var arr strings.Builder
		for _, w := range words {
			arr.WriteString(" '" + w + "'")
		}
		prog := "source " + script + "\nCOMP_WORDS=(" + arr.String() + ")\nCOMP_CWORD=" + strconv.Itoa(len(words)-1) + "\n_sluice\necho \"${COMPREPLY[*]}\"\n"
		got, err := exec.Command(bash, "-c", prog).CombinedOutput()
		if err != nil || strings.TrimSpace(string(got)) != tc.want {
			t.Errorf("%q completes to %q (%v), want %q", tc.line, got, err, tc.want)
		}
	}
}

// The zsh and fish scripts are printed, and checked by their shells where
// the machine has them; an unknown shell is a usage error.
func TestCompletionOtherShells(t *testing.T) {
	for _, shell := range []string{"zsh", "fish"} {
		var out, errOut bytes.Buffer
		if code := run([]string{"completion", shell}, &out, &errOut, noEnv); code != 0 || !strings.Contains(out.String(), "admin") {
			t.Fatalf("completion %s: exit %d, %q", shell, code, errOut.String())
		}
		bin, err := exec.LookPath(shell)
		if err != nil {
			t.Logf("no %s on this machine: its script is not checked", shell)
			continue
		}
		script := filepath.Join(t.TempDir(), "sluice."+shell)
		os.WriteFile(script, out.Bytes(), 0o644)
		if msg, err := exec.Command(bin, "-n", script).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v: %s", shell, err, msg)
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"completion", "tcsh"}, &out, &errOut, noEnv); code != 2 || !strings.Contains(errOut.String(), "Usage: sluice completion") {
		t.Errorf("completion tcsh: exit %d, %q; want 2 and the usage", code, errOut.String())
	}
}
