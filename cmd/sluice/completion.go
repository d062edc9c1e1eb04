package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
)

// cmdNode is a command of the completion tree: its words, its flags and
// its subcommands.
type cmdNode struct {
	name string
	subs []*cmdNode
	// flags are the names of the command's flags, without dashes.
	flags []string
}

// completionCommands returns the commands of the command line, each with
// its subcommands and the flags it takes (its parents' included), and the
// top-level commands.
func completionCommands() (nodes []*cmdNode, top []string, err error) {
	k, err := newParser(&cli{}, io.Discard, io.Discard, func(string) string { return "" }, func(int) {})
	if err != nil {
		return nil, nil, err
	}
	var walk func(n *kong.Node, path string, flags []string)
	walk = func(n *kong.Node, path string, flags []string) {
		for _, f := range n.Flags {
			if !f.Hidden && f.Name != "help" {
				flags = append(slices.Clip(flags), f.Name)
			}
		}
		if path != "" {
			node := &cmdNode{name: path, flags: flags}
			for _, c := range n.Children {
				if !c.Hidden {
					node.subs = append(node.subs, &cmdNode{name: c.Name})
				}
			}
			for _, p := range n.Positional { // the words an argument takes
				for _, e := range strings.Split(p.Enum, ",") {
					if e = strings.TrimSpace(e); e != "" {
						node.subs = append(node.subs, &cmdNode{name: e})
					}
				}
			}
			nodes = append(nodes, node)
		}
		for _, c := range n.Children {
			if c.Hidden {
				continue
			}
			if path == "" {
				top = append(top, c.Name)
			}
			walk(c, strings.TrimSpace(path+" "+c.Name), flags)
		}
	}
	walk(k.Model.Node, "", nil)
	top = append(top, "help")
	nodes = append(nodes, &cmdNode{name: "help"})
	return nodes, top, nil
}

// completionCmd prints the completion script of a shell.
type completionCmd struct {
	Shell string `arg:"" enum:"bash,zsh,fish" help:"bash, zsh or fish"`
}

func (completionCmd) Help() string {
	return `Prints a shell completion script of sluice's commands, subcommands and flags. Load it with, for example:

  bash:  source <(sluice completion bash)   (or save it in /etc/bash_completion.d/sluice)
  zsh:   source <(sluice completion zsh)
  fish:  sluice completion fish > ~/.config/fish/completions/sluice.fish`
}

func (c *completionCmd) run(inv *invocation) int {
	nodes, top, err := completionCommands()
	if err != nil {
		fmt.Fprintf(inv.stderr, "sluice completion: %v\n", err)
		return 1
	}
	switch c.Shell {
	case "bash":
		bashCompletion(inv.stdout, nodes, top)
	case "zsh":
		fmt.Fprint(inv.stdout, "#compdef sluice\n# sluice's completion for zsh, through bash's.\nautoload -U +X bashcompinit && bashcompinit\n")
		bashCompletion(inv.stdout, nodes, top)
	case "fish":
		fishCompletion(inv.stdout, nodes, top)
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
