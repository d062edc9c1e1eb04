package main

import (
	"bytes"
	"strings"
	"testing"
)

// A value a flag cannot take is refused (exit 2) saying what the flag
// wants, from the command line and from the environment alike.
func TestBadFlagValuesSayWhatIsExpected(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"serve", "--store-deadline", "5"}, nil, `--store-deadline: "5" is not a duration; use 5ms or 5s`},
		{[]string{"serve", "--grpc-keepalive", "soon"}, nil, `--grpc-keepalive: "soon" is not a duration; use a number and a unit, such as 1m0s`},
		{[]string{"serve", "--gc-percent", "lots"}, nil, `--gc-percent: "lots" is not a whole number; use one such as 400`},
		{[]string{"serve", "--breaker=maybe"}, nil, `--breaker: "maybe" is not a boolean; use true or false`},
		{[]string{"serve", "--breaker-failure-ratio", "half"}, nil, `--breaker-failure-ratio: "half" is not a number; use one such as 0.5`},
		{[]string{"serve", "--breaker-probes", "-1"}, nil, `--breaker-probes: "-1" is not a whole number of 0 or more`},
		{[]string{"serve"}, map[string]string{"SLUICE_STORE_DEADLINE": "5"}, `SLUICE_STORE_DEADLINE: --store-deadline: "5" is not a duration`},
		{[]string{"check"}, map[string]string{"SLUICE_CHECK_TIMEOUT": "2"}, `SLUICE_CHECK_TIMEOUT: --timeout: "2" is not a duration`},
		{[]string{"check", "--timeout", "2"}, nil, `--timeout: "2" is not a duration; use 2ms or 2s`},
		{[]string{"check", "--cost", "many"}, nil, `--cost: "many" is not a whole number; use one such as 1`},
		{[]string{"admin", "throttle", "--percent", "half"}, nil, `--percent: "half" is not a number; use one such as -1`},
		{[]string{"migrate", "--timeout"}, nil, `--timeout: needs a value`},
		{[]string{"admin", "override", "add", "user", "u", "--duration", "2"}, nil, `--duration: "2" is not a duration; use 2ms or 2s`},
		{[]string{"config", "validate", "--merge-domain-config=perhaps", "x"}, nil, `--merge-domain-config: "perhaps" is not a boolean`},
		{[]string{"serve", "--store", "localhost:6379"}, nil, `--store: "localhost:6379" is not a URL; use memory://, redis://host:6379`},
		{[]string{"serve", "--store", "http://user:s3cret@x"}, nil, `--store: "http://…@x": scheme "http" is not one of memory, redis`},
		{[]string{"serve"}, map[string]string{"SLUICE_ANALYTICS": "localhost"}, `--analytics: "localhost" is not a URL; use postgres://user:password@host:5432/db`},
		{[]string{"serve", "--config-store", "127.0.0.1:2379"}, nil, `--config-store: "127.0.0.1:2379" is not a URL; use etcd://host:2379`},
		{[]string{"admin", "status", "--addr", "localhost:8080"}, nil, `--addr: "localhost:8080" is not a URL; use http://host:port or https://host:port`},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut, func(k string) string { return tc.env[k] })
		if code != 2 || !strings.Contains(errOut.String(), tc.want) || strings.Contains(errOut.String(), "s3cret") {
			t.Errorf("sluice %s: exit %d, %q; want 2 and %q", strings.Join(tc.args, " "), code, errOut.String(), tc.want)
		}
	}
}

// Every command's help exits 0 and shows the defaults and the SLUICE_*
// variable of its flags; an unknown flag or subcommand prints the usage
// and exits 2.
func TestEveryCommandsHelp(t *testing.T) {
	for _, tc := range []struct {
		cmd  []string
		want []string // in the help
	}{
		{[]string{}, []string{"serve [flags]", "admin <command>", "completion <shell>", "--version"}},
		{[]string{"serve"}, []string{"--", "SLUICE_STORE", `--store="memory://"`, "--breaker", "(default true)"}},
		{[]string{"config", "validate"}, []string{"SLUICE_MERGE_DOMAIN_CONFIG"}},
		{[]string{"check"}, []string{"SLUICE_ADDR", "SLUICE_CHECK_TIMEOUT", "--timeout=2s", "SLUICE_TLS_CA", "--insecure-skip-verify"}},
		{[]string{"migrate"}, []string{"SLUICE_ANALYTICS", "SLUICE_MIGRATE_TIMEOUT", "--timeout=1m0s"}},
		{[]string{"admin"}, []string{"sluice admin <command>", "rules list", "token hash"}},
		{[]string{"admin", "rules", "put"}, []string{"SLUICE_ADDR", "SLUICE_TOKEN", "SLUICE_ADMIN_F", `--addr="http://127.0.0.1:8080"`, "SLUICE_TLS_CA"}},
		{[]string{"admin", "override", "add"}, []string{"SLUICE_ADMIN_DURATION", "SLUICE_ADMIN_RULE"}},
		{[]string{"admin", "throttle"}, []string{"SLUICE_ADMIN_PERCENT", "--percent=-1"}},
		{[]string{"admin", "token", "new"}, []string{"SLUICE_ADMIN_ROLE"}},
		{[]string{"admin", "audit"}, []string{"SLUICE_ADMIN_SINCE"}},
		{[]string{"admin", "status"}, []string{"SLUICE_TOKEN"}},
		{[]string{"completion"}, []string{"bash", "zsh", "fish"}},
	} {
		name := strings.Join(append([]string{"sluice"}, tc.cmd...), " ")
		var out, errOut bytes.Buffer
		if code := run(append(tc.cmd, "--help"), &out, &errOut, noEnv); code != 0 {
			t.Errorf("%s --help: exit %d, want 0: %s", name, code, errOut.String())
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s --help does not show %s:\n%s", name, w, out.String())
			}
		}
		if len(tc.cmd) == 0 || tc.cmd[0] == "completion" || (tc.cmd[0] == "admin" && len(tc.cmd) == 1) {
			continue
		}
		out.Reset()
		errOut.Reset()
		if code := run(append(tc.cmd, "--no-such-flag"), &out, &errOut, noEnv); code != 2 ||
			!strings.Contains(errOut.String(), "Usage: sluice") || !strings.Contains(errOut.String(), "unknown flag --no-such-flag") {
			t.Errorf("%s --no-such-flag: exit %d, %q; want 2, the usage and the flag", name, code, errOut.String())
		}
	}
	for _, args := range [][]string{{"nope"}, {"config", "nope"}, {"admin", "nope"}, {"admin", "rules", "nope"}, {"completion", "tcsh"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut, noEnv); code != 2 || !strings.Contains(errOut.String(), "sluice ") {
			t.Errorf("sluice %s: exit %d, %q; want 2 and the usage", strings.Join(args, " "), code, errOut.String())
		}
	}
}
