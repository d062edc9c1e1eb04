package main

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// cmdNode is a command of the completion tree: its words, its flags and
// its subcommands.
type cmdNode struct {
	name string
	subs []*cmdNode
	// flags are the names of the command's flags, without dashes.
	flags []string
}

// completionTree lists sluice's commands and subcommands. Their flags are
// read from each command's own --help, so that the completion says what
// the flag sets define.
var completionTree = []struct {
	path string // the command's words
	subs string // its subcommands, space-separated
}{
	{"serve", ""},
	{"config", "validate"},
	{"config validate", ""},
	{"check", ""},
	{"admin", "rules limits tier override throttle audit status token"},
	{"admin rules", "list get put delete"},
	{"admin limits", ""},
	{"admin tier", "set"},
	{"admin override", "list add rm"},
	{"admin throttle", "list lift"},
	{"admin audit", ""},
	{"admin status", ""},
	{"admin token", "hash new list rm"},
	{"migrate", ""},
	{"version", ""},
	{"completion", "bash zsh fish"},
	{"help", ""},
}

// helpFlag is a flag's line in the flag package's usage.
var helpFlag = regexp.MustCompile(`(?m)^  -([a-zA-Z0-9][a-zA-Z0-9-]*)`)

// commandFlags returns the flags of the command of words, read from its
// --help.
func commandFlags(words []string) []string {
	if words[0] == "version" || words[0] == "help" || words[0] == "completion" || (words[0] == "config" && len(words) == 1) {
		return nil
	}
	var out bytes.Buffer
	run(append(slices.Clone(words), "--help"), &out, io.Discard, func(string) string { return "" })
	var flags []string
	for _, m := range helpFlag.FindAllStringSubmatch(out.String(), -1) {
		flags = append(flags, m[1])
	}
	return flags
}

// completionCommands returns the commands of the completion tree with
// their flags, and the top-level commands.
func completionCommands() (nodes []*cmdNode, top []string) {
	for _, c := range completionTree {
		words := strings.Fields(c.path)
		n := &cmdNode{name: c.path, flags: commandFlags(words)}
		for _, s := range strings.Fields(c.subs) {
			n.subs = append(n.subs, &cmdNode{name: s})
		}
		if len(words) == 1 {
			top = append(top, c.path)
		}
		nodes = append(nodes, n)
	}
	return nodes, top
}

const completionUsage = `Usage: sluice completion bash|zsh|fish

Prints a shell completion script of sluice's commands, subcommands and
flags. Load it with, for example:

  bash:  source <(sluice completion bash)   (or save it in /etc/bash_completion.d/sluice)
  zsh:   source <(sluice completion zsh)
  fish:  sluice completion fish > ~/.config/fish/completions/sluice.fish
`

// completion prints the completion script of a shell.
func completion(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && isHelp(args[0]) {
		fmt.Fprint(stdout, completionUsage)
		return 0
	}
	if len(args) != 1 {
		fmt.Fprint(stderr, completionUsage)
		return 2
	}
	nodes, top := completionCommands()
	switch args[0] {
	case "bash":
		bashCompletion(stdout, nodes, top)
	case "zsh":
		fmt.Fprint(stdout, "#compdef sluice\n# sluice's completion for zsh, through bash's.\nautoload -U +X bashcompinit && bashcompinit\n")
		bashCompletion(stdout, nodes, top)
	case "fish":
		fishCompletion(stdout, nodes, top)
	default:
		fmt.Fprintf(stderr, "sluice completion: unknown shell %q\n\n%s", args[0], completionUsage)
		return 2
	}
	return 0
}

// dashed returns flags as --flag words.
func dashed(flags []string) string {
	var b strings.Builder
	for i, f := range flags {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("--" + f)
	}
	return b.String()
}

// subNames returns the names of n's subcommands.
func subNames(n *cmdNode) []string {
	var out []string
	for _, s := range n.subs {
		out = append(out, s.name)
	}
	return out
}

// bashCompletion writes a bash completion function: the words typed that
// are no flags select the command, whose subcommands and flags complete.
func bashCompletion(w io.Writer, nodes []*cmdNode, top []string) {
	fmt.Fprint(w, `# sluice's completion for bash: source <(sluice completion bash)
_sluice() {
    local cur="${COMP_WORDS[COMP_CWORD]}" path="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${COMP_WORDS[i]}" in
            -*) ;;
            *) path="${path:+$path }${COMP_WORDS[i]}" ;;
        esac
    done
    local words=""
    case "$path" in
`)
	fmt.Fprintf(w, "        \"\") words=%q ;;\n", strings.Join(top, " ")+" --help --version")
	// The commands as typed, then, deepest first, with arguments after.
	for _, n := range nodes {
		fmt.Fprintf(w, "        %q) words=%q ;;\n", n.name, strings.TrimSpace(strings.Join(subNames(n), " ")+" "+dashed(n.flags)))
	}
	byDepth := slices.Clone(nodes)
	slices.SortStableFunc(byDepth, func(a, b *cmdNode) int {
		return strings.Count(b.name, " ") - strings.Count(a.name, " ")
	})
	for _, n := range byDepth {
		fmt.Fprintf(w, "        %q*) words=%q ;;\n", n.name+" ", dashed(n.flags))
	}
	fmt.Fprint(w, `    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _sluice sluice
`)
}

// fishCompletion writes fish completions: a command's subcommands once
// its words are typed, and its flags.
func fishCompletion(w io.Writer, nodes []*cmdNode, top []string) {
	fmt.Fprintln(w, "# sluice's completion for fish: sluice completion fish > ~/.config/fish/completions/sluice.fish")
	fmt.Fprintln(w, "complete -c sluice -f")
	fmt.Fprintf(w, "complete -c sluice -n '__fish_use_subcommand' -a '%s'\n", strings.Join(top, " "))
	for _, n := range nodes {
		words := strings.Fields(n.name)
		var cond []string
		for _, wd := range words {
			cond = append(cond, "__fish_seen_subcommand_from "+wd)
		}
		if subs := subNames(n); len(subs) > 0 {
			fmt.Fprintf(w, "complete -c sluice -n '%s; and not __fish_seen_subcommand_from %s' -a '%s'\n",
				strings.Join(cond, "; and "), strings.Join(subs, " "), strings.Join(subs, " "))
		}
		for _, f := range n.flags {
			fmt.Fprintf(w, "complete -c sluice -n '%s' -l %s\n", strings.Join(cond, "; and "), f)
		}
	}
}
