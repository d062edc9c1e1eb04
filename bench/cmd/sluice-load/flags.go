package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
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
	fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
	if !unknown {
		fmt.Fprintf(stderr, "Run \"%s --help\" for the flags.\n", fs.Name())
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
// wants: `--duration: "5" is not a duration; use 5ms or 5s`.
func explainValue(f *flag.Flag, value string, cause error) error {
	var want string
	var v any
	if g, ok := f.Value.(flag.Getter); ok {
		v = g.Get()
	}
	switch v.(type) {
	case time.Duration:
		want = "is not a duration; use a number and a unit, such as 500ms, 10s or 1m"
		if _, err := strconv.ParseFloat(value, 64); err == nil {
			n := strings.TrimSpace(value)
			want = "is not a duration; use " + n + "ms or " + n + "s (a number and a unit)"
		}
	case bool:
		want = "is not a boolean; use true or false"
	case int, int64:
		want = "is not a whole number; use one such as " + example(f.DefValue, "10")
		var ne *strconv.NumError
		if _, err := strconv.ParseInt(value, 0, 64); errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			want = "is out of range"
		}
	case uint, uint64:
		want = "is not a whole number of 0 or more; use one such as " + example(f.DefValue, "10")
	case float64:
		want = "is not a number; use one such as " + example(f.DefValue, "0.5")
	default:
		return fmt.Errorf("--%s: %v", f.Name, cause)
	}
	return fmt.Errorf("--%s: %q %s", f.Name, value, want)
}

// example returns def, or alt when def is zero.
func example(def, alt string) string {
	if def == "" || def == "0" {
		return alt
	}
	return def
}

// envFlags names in the usage of each flag of fs its environment
// variable, prefix and the flag's name in upper case with '_' for '-',
// and returns the function that, once fs is parsed, sets each flag not
// given on the command line from its variable, when that is set.
func envFlags(fs *flag.FlagSet, prefix string) func(getenv func(string) string) error {
	name := func(f *flag.Flag) string {
		return prefix + strings.ReplaceAll(strings.ToUpper(f.Name), "-", "_")
	}
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " (env " + name(f) + ")" })
	return func(getenv func(string) string) error {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		var err error
		fs.VisitAll(func(f *flag.Flag) {
			if given[f.Name] || err != nil {
				return
			}
			if v := getenv(name(f)); v != "" {
				if e := fs.Set(f.Name, v); e != nil {
					err = fmt.Errorf("%s: %w", name(f), explainValue(f, v, e))
				}
			}
		})
		return err
	}
}
