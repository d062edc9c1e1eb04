package main

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// The command line is parsed by kong from the structs of the commands:
// each flag's name, default, help and SLUICE_* variable are in its tags.
// This file holds what Sluice adds to kong: the variables read through a
// getenv of the caller's (an empty variable counts as unset), errors that
// say what a flag wants, and the exit codes.

// newParser returns the parser of the command line into c, writing help to
// stdout. A flag's variable is read through getenv when the flag is not on
// the command line. exit is called with 0 after --help was printed.
func newParser(c *cli, stdout, stderr io.Writer, getenv func(string) string, exit func(int)) (*kong.Kong, error) {
	return kong.New(c,
		kong.Name("sluice"),
		kong.Description(rootHelp),
		kong.Writers(stdout, stderr),
		kong.Exit(exit),
		// As with the flag package, a flag's value may start with a
		// dash: --grpc-keepalive -1s.
		kong.WithHyphenPrefixedParameters(true),
		kong.Vars(defaults()),
		kong.ConfigureHelp(kong.HelpOptions{NoExpandSubcommands: true}),
		kong.ValueFormatter(helpValue),
		kong.PostBuild(ownEnv),
		kong.Resolvers(envResolver(getenv)),
		hintMappers(),
	)
}

// ownEnv leaves the environment to envResolver: kong would read the
// variables named by the env tags itself, from the process's environment,
// and take an empty one as a value. The tags stay, read by envResolver and
// helpValue.
func ownEnv(k *kong.Kong) error {
	return kong.Visit(k.Model, func(node kong.Visitable, next kong.Next) error {
		if f, ok := node.(*kong.Flag); ok {
			f.Envs, f.Tag.Envs = nil, nil
		}
		return next(nil)
	})
}

// envName returns the environment variable of flag f, or "".
func envName(f *kong.Value) string {
	if f.Tag == nil {
		return ""
	}
	return f.Tag.Get("env")
}

// envResolver sets each flag not given on the command line from its
// variable, when that is set and not empty. A value the flag cannot take is
// an envError naming the variable.
func envResolver(getenv func(string) string) kong.Resolver {
	return kong.ResolverFunc(func(_ *kong.Context, _ *kong.Path, f *kong.Flag) (any, error) {
		name := envName(f.Value)
		if name == "" {
			return nil, nil
		}
		v := getenv(name)
		if v == "" {
			return nil, nil
		}
		// Decoded aside first, so that an error names the variable.
		scratch := reflect.New(f.Target.Type()).Elem()
		scan := kong.ScanFromTokens(kong.Token{Type: kong.FlagValueToken, Value: v})
		if err := f.Mapper.Decode(&kong.DecodeContext{Value: f.Value, Scan: scan}, scratch); err != nil {
			return nil, &envError{env: name, flag: f.Name, err: err}
		}
		return v, nil
	})
}

// envError is a value of a flag's variable that the flag cannot take.
type envError struct {
	env, flag string
	err       error
}

func (e *envError) Error() string { return fmt.Sprintf("%s: --%s: %v", e.env, e.flag, e.err) }
func (e *envError) Unwrap() error { return e.err }

// valueError is a value that a flag cannot take, with what it wants.
type valueError struct{ msg string }

func (e *valueError) Error() string { return e.msg }

// helpValue is a flag's help: its text, "(default true)" for a boolean on
// by default (whose default shows nowhere else), and its variable.
func helpValue(v *kong.Value) string {
	help := v.Help
	if v.Target.Kind() == reflect.Bool && v.Default == "true" {
		help += " (default true)"
	}
	if env := envName(v); env != "" {
		help += " ($" + env + ")"
	}
	return help
}

// hintMappers decodes the numbers, durations and booleans of the flags as
// kong does, and says what a flag wants when a value will not do:
// `"5" is not a duration; use 5ms or 5s (a number and a unit)`.
func hintMappers() kong.Option {
	reg := kong.NewRegistry().RegisterDefaults()
	var opts []kong.Option
	for _, v := range []any{time.Duration(0), false, int(0), int64(0), uint(0), float64(0)} {
		t := reflect.TypeOf(v)
		opts = append(opts, kong.TypeMapper(t, hintMapper{next: reg.ForType(t), bool: t.Kind() == reflect.Bool}))
	}
	return kong.OptionFunc(func(k *kong.Kong) error {
		for _, o := range opts {
			if err := o.Apply(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// hintMapper is kong's mapper of a type, whose errors say what the flag
// wants.
type hintMapper struct {
	next kong.Mapper
	bool bool
}

func (m hintMapper) IsBool() bool { return m.bool }

func (m hintMapper) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	tok := ctx.Scan.Peek()
	err := m.next.Decode(ctx, target)
	if err == nil {
		return nil
	}
	if tok.IsEOL() {
		return &valueError{"needs a value"}
	}
	value := fmt.Sprint(tok.Value)
	def := ctx.Value.Default
	var want string
	switch target.Interface().(type) {
	case time.Duration:
		want = "is not a duration; use " + durationHint(value, def)
	case bool:
		want = "is not a boolean; use true or false"
	case int, int64:
		want = "is not a whole number; use one such as " + numberHint(def, "10")
		if isRangeError(strconv.ParseInt(value, 0, 64)) {
			want = "is out of range"
		}
	case uint:
		want = "is not a whole number of 0 or more; use one such as " + numberHint(def, "10")
	case float64:
		want = "is not a number; use one such as " + numberHint(def, "0.5")
	default:
		return err
	}
	return &valueError{fmt.Sprintf("%q %s", value, want)}
}

// durationHint returns a duration for value: a bare number with a unit,
// or else an example.
func durationHint(value, def string) string {
	if _, err := strconv.ParseFloat(value, 64); err == nil {
		n := strings.TrimSpace(value)
		return n + "ms or " + n + "s (a number and a unit)"
	}
	if def == "" || def == "0s" || def == "0" {
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

// longDashes returns args with a flag written with one dash, as the flag
// package took them (-store memory://), written with two (--store). A
// single letter after one dash stays a short flag (-h, -f).
func longDashes(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if singleDashFlag.MatchString(a) {
			out[i] = "-" + a
		}
	}
	return out
}

var singleDashFlag = regexp.MustCompile(`^-[a-z][a-z0-9-]+(=|$)`)

// urlFlags are the flags whose values are URLs: the schemes each takes
// and the form told when a value has none of them. An empty value is the
// flag's "none".
var urlFlags = map[string]struct {
	schemes []string
	want    string
}{
	"store":        {[]string{"memory", "redis", "rediss", "redis-cluster", "rediss-cluster", "redis-sentinel"}, "memory://, redis://host:6379[/db], redis-cluster://host:7000,host:7000 (rediss:// for TLS) or redis-sentinel://host:26379/master"},
	"analytics":    {[]string{"postgres", "postgresql"}, "postgres://user:password@host:5432/db"},
	"config-store": {[]string{"etcd", "etcds"}, "etcd://host:2379[,host:2379...][/prefix] (etcds:// for TLS)"},
	"addr":         {[]string{"http", "https"}, "http://host:port or https://host:port"},
}

// checkURLFlags returns the error of the first URL flag of the command
// (see urlFlags) whose value is no URL of a scheme it takes, saying the
// form it wants. A password in the value is not repeated.
func checkURLFlags(ctx *kong.Context) error {
	for _, f := range ctx.Flags() {
		u, ok := urlFlags[f.Name]
		if !ok || f.Target.Kind() != reflect.String {
			continue
		}
		if err := checkURL(f.Name, f.Target.String(), u.schemes, u.want); err != nil {
			return err
		}
	}
	return nil
}

// checkURL returns the error of a value v of flag name that is not a URL
// of one of schemes.
func checkURL(name, v string, schemes []string, want string) error {
	if v == "" || (name == "analytics" && strings.Contains(v, "=")) { // PostgreSQL's keyword=value form
		return nil
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
		return fmt.Errorf("--%s: %q is not a URL; use %s", name, shown, want)
	case !slices.Contains(schemes, scheme):
		return fmt.Errorf("--%s: %q: scheme %q is not one of %s; use %s", name, shown, scheme, strings.Join(schemes, ", "), want)
	}
	return nil
}
