package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// parseFlags parses args with fs and returns -1 to go on, else the exit
// code: 0 when args ask for help (the usage then goes to stdout), 2 for a
// flag fs does not know or a value its flag cannot take (the error, saying
// what the flag wants, and the usage go to stderr). The flag package's own
// message is replaced, so fs prints nothing itself.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) int {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case err == nil:
		fs.SetOutput(stderr)
		return -1
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return 0
	}
	fs.SetOutput(stderr)
	err, unknown := explainParseError(fs, err)
	if unknown {
		// The usage, then the error, which a long usage would scroll away.
		fs.Usage()
		fmt.Fprintln(stderr)
	}
	fmt.Fprintf(stderr, "sluice %s: %v\n", fs.Name(), err)
	if !unknown {
		fmt.Fprintf(stderr, "Run \"sluice %s --help\" for the flags.\n", fs.Name())
	}
	return 2
}

// The flag package's errors, which parseFlags rewrites.
var (
	badValue    = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-(\S+): `)
	unknownFlag = regexp.MustCompile(`^flag provided but not defined: -+(\S+)`)
	missingArg  = regexp.MustCompile(`^flag needs an argument: -+(\S+)`)
)

// explainParseError returns the error of fs.Parse told in terms of the
// flag: a value it cannot take with the form it wants; unknown reports a
// flag that fs does not have.
func explainParseError(fs *flag.FlagSet, err error) (_ error, unknown bool) {
	msg := err.Error()
	if m := badValue.FindStringSubmatch(msg); m != nil {
		if f := fs.Lookup(m[2]); f != nil {
			if s, err := strconv.Unquote(`"` + m[1] + `"`); err == nil {
				m[1] = s
			}
			return explainValue(f, m[1], errors.New(msg[len(m[0]):])), false
		}
	}
	if m := unknownFlag.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("unknown flag --%s", m[1]), true
	}
	if m := missingArg.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("--%s needs a value", m[1]), false
	}
	return err, false
}

// explainValue returns the error of value given to flag f, saying what f
// wants: `--store-deadline: "5" is not a duration; use 5ms or 5s`. A
// flag of a type of its own says so in its error, cause.
func explainValue(f *flag.Flag, value string, cause error) error {
	var want string
	g, _ := f.Value.(flag.Getter)
	var v any
	if g != nil {
		v = g.Get()
	}
	switch v.(type) {
	case time.Duration:
		want = "is not a duration; use " + durationHint(value, f.DefValue)
	case bool:
		want = "is not a boolean; use true or false"
	case int, int64:
		want = "is not a whole number; use one such as " + numberHint(f.DefValue, "10")
		if isRangeError(strconv.ParseInt(value, 0, 64)) {
			want = "is out of range"
		}
	case uint, uint64:
		want = "is not a whole number of 0 or more; use one such as " + numberHint(f.DefValue, "10")
	case float64:
		want = "is not a number; use one such as " + numberHint(f.DefValue, "0.5")
	default:
		return fmt.Errorf("--%s: %v", f.Name, cause)
	}
	return fmt.Errorf("--%s: %q %s", f.Name, value, want)
}

// durationHint returns a duration for value: a bare number with a unit,
// or else an example.
func durationHint(value, def string) string {
	if _, err := strconv.ParseFloat(value, 64); err == nil {
		n := strings.TrimSpace(value)
		return n + "ms or " + n + "s (a number and a unit)"
	}
	if def == "" || def == "0s" {
		return "a number and a unit, such as 500ms, 10s or 1m"
	}
	return "a number and a unit, such as " + def
}

// numberHint returns def, or alt when def is zero.
func numberHint(def, alt string) string {
	if def == "" || def == "0" {
		return alt
	}
	return def
}

func isRangeError(_ int64, err error) bool {
	var ne *strconv.NumError
	return errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange)
}

// sluiceEnv returns the environment variable of every flag of fs: SLUICE_
// and the flag's name in upper case, with '_' for '-'.
func sluiceEnv(fs *flag.FlagSet) map[string]string {
	return commandEnv(fs, "", nil)
}

// commandEnv returns the environment variable of every flag of fs:
// SLUICE_, the command's name (cmd, empty for serve's), and the flag's, in
// upper case with '_' for '-' and ' '; shared names the variables of the
// flags that several commands read alike (--addr: SLUICE_ADDR).
func commandEnv(fs *flag.FlagSet, cmd string, shared map[string]string) map[string]string {
	prefix := "SLUICE_"
	if cmd != "" {
		prefix += cmd + "_"
	}
	vars := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := shared[f.Name]; ok {
			vars[f.Name] = v
			return
		}
		vars[f.Name] = strings.NewReplacer("-", "_", " ", "_").Replace(strings.ToUpper(prefix + f.Name))
	})
	return vars
}

// envFlags names in the usage of each flag of vars (flag name to variable
// name) its environment variable, and returns the function that, once fs
// is parsed, sets each of those flags not given on the command line from
// its variable, when that is set. The flags keep their own defaults, so
// the usage never prints a variable's value (a store URL's password).
func envFlags(fs *flag.FlagSet, vars map[string]string) func(getenv func(string) string) error {
	fs.VisitAll(func(f *flag.Flag) {
		if env, ok := vars[f.Name]; ok {
			f.Usage += " (env " + env + ")"
		}
	})
	return func(getenv func(string) string) error {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		var err error
		fs.VisitAll(func(f *flag.Flag) {
			env, ok := vars[f.Name]
			if !ok || given[f.Name] || err != nil {
				return
			}
			if v := getenv(env); v != "" {
				if e := fs.Set(f.Name, v); e != nil {
					err = fmt.Errorf("%s: %w", env, explainValue(f, v, e))
				}
			}
		})
		return err
	}
}

// urlFlags are the flags whose values are URLs: the schemes each takes
// and the form told when a value has none of them. An empty value is the
// flag's "none".
var urlFlags = map[string]struct {
	schemes []string
	want    string
}{
	"store":        {[]string{"memory", "redis", "rediss", "redis-cluster", "rediss-cluster"}, "memory://, redis://host:6379[/db] or redis-cluster://host:7000,host:7000 (rediss:// for TLS)"},
	"analytics":    {[]string{"postgres", "postgresql"}, "postgres://user:password@host:5432/db"},
	"config-store": {[]string{"etcd", "etcds"}, "etcd://host:2379[,host:2379...][/prefix] (etcds:// for TLS)"},
	"addr":         {[]string{"http", "https"}, "http://host:port or https://host:port"},
}

// checkURLFlags returns the error of the first URL flag of fs (see
// urlFlags) whose value is no URL of a scheme it takes, saying the form it
// wants. A password in the value is not repeated.
func checkURLFlags(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		u, ok := urlFlags[f.Name]
		v := f.Value.String()
		if !ok || err != nil || v == "" {
			return
		}
		if f.Name == "analytics" && strings.Contains(v, "=") {
			return // PostgreSQL's keyword=value form
		}
		scheme, rest, found := strings.Cut(v, "://")
		shown := v
		if at := strings.LastIndex(rest, "@"); found && at >= 0 {
			shown = scheme + "://…" + rest[at:]
		} else if at := strings.LastIndex(v, "@"); !found && at >= 0 {
			shown = "…" + v[at:]
		}
		switch {
		case !found:
			err = fmt.Errorf("--%s: %q is not a URL; use %s", f.Name, shown, u.want)
		case !slices.Contains(u.schemes, scheme):
			err = fmt.Errorf("--%s: %q: scheme %q is not one of %s; use %s", f.Name, shown, scheme, strings.Join(u.schemes, ", "), u.want)
		}
	})
	return err
}
