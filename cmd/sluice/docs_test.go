package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// commandFlags returns the flags of every command of the command line,
// its parents' included, by the command's words ("admin rules put").
func commandFlags(t *testing.T) map[string]map[string]bool {
	t.Helper()
	k, err := newParser(&cli{}, io.Discard, io.Discard, noEnv, func(int) {})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	var walk func(n *kong.Node, path string, inherited map[string]bool)
	walk = func(n *kong.Node, path string, inherited map[string]bool) {
		flags := map[string]bool{}
		for f := range inherited {
			flags[f] = true
		}
		for _, f := range n.Flags {
			flags[f.Name] = true
		}
		out[path] = flags
		for _, c := range n.Children {
			walk(c, strings.TrimSpace(path+" "+c.Name), flags)
		}
	}
	walk(k.Model.Node, "", nil)
	return out
}

// The documentation names the flags as the binary has them: every flag of
// `sluice serve` is in README.md or docs/, every row of a flags table in
// docs/ is one of serve's flags, and each `sluice COMMAND --flag` line of
// README.md and docs/ names flags that COMMAND has.
func TestDocsNameTheFlags(t *testing.T) {
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	var all strings.Builder
	texts := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = string(data)
		all.Write(data)
	}
	cmds := commandFlags(t)
	serve := cmds["serve"]
	if len(serve) < 50 {
		t.Fatalf("serve has %d flags", len(serve))
	}
	for f := range serve {
		if f != "help" && !regexp.MustCompile(`--`+regexp.QuoteMeta(f)+`\b[^-]`).MatchString(all.String()) {
			t.Errorf("sluice serve --%s is in no document", f)
		}
	}
	row := regexp.MustCompile("(?m)^\\| `--([a-z][a-z0-9-]*)")
	cmdLine := regexp.MustCompile(`(?m)(?:^|\x60|\$ )(?:go run \./cmd/sluice|bin/sluice|sluice) ([a-z][a-z ]*?)(?: --|\x60|$)(.*)`)
	flag := regexp.MustCompile(`(?:^|\s)--([a-z][a-z0-9-]*)`)
	for f, text := range texts {
		name := filepath.Base(f)
		for _, m := range row.FindAllStringSubmatch(text, -1) {
			if !serve[m[1]] {
				t.Errorf("%s: the flags table names --%s, which sluice serve does not have", name, m[1])
			}
		}
		for _, m := range cmdLine.FindAllStringSubmatch(text, -1) {
			words := strings.Fields(m[1])
			path := ""
			for _, w := range words {
				if _, ok := cmds[strings.TrimSpace(path+" "+w)]; !ok {
					break
				}
				path = strings.TrimSpace(path + " " + w)
			}
			if path == "" || len(words) == 0 {
				continue // not a command of this binary (another's)
			}
			line := "--" + m[2]
			if cut := strings.Index(line, "`"); cut >= 0 {
				line = line[:cut]
			}
			for _, fm := range flag.FindAllStringSubmatch(line, -1) {
				if !cmds[path][fm[1]] {
					t.Errorf("%s: `sluice %s` is given --%s, which it does not have", name, path, fm[1])
				}
			}
		}
	}
}
