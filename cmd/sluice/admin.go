package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/auth"
)

const adminUsage = `Usage: sluice admin COMMAND [flags]

  rules list | get ID | put -f FILE | delete ID [--version N]
  limits KIND ID                         effective limits, tier and overrides of an identity
  tier set KIND ID TIER [--reason R] [--version N]
  override list KIND ID
  override add KIND ID --rule R --limit N [--window W] --duration D --reason R
  override rm KIND ID OVERRIDE_ID [--reason R]
  throttle --scope global|region|client [--target T] --percent P --duration D --reason R
  throttle list | lift ID [--reason R]
  audit [--object O] [--id ID] [--actor A] [--since RFC3339] [--limit N]
  status                                 the control plane's status
  token hash                             read a token on stdin, print its tokens-file sha256 line
  token new NAME --role viewer|operator|admin
  token list | rm NAME

KIND is user, client or api_key. Every command but "token hash" takes
--addr (default http://127.0.0.1:8080, env SLUICE_ADDR) and --token (env
SLUICE_TOKEN). A command exits 0 on success, 1 when the server refuses
(its JSON error is printed), 2 on usage errors and 3 when the server cannot
be reached.
`

// adminCmd is one admin command line being run.
type adminCmd struct {
	fs     *flag.FlagSet
	addr   *string
	token  *string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	pos    []string // positional arguments, flags removed
	// fromEnv sets the flags not given from the environment (getenv).
	fromEnv func(getenv func(string) string) error
	getenv  func(string) string
	// help is set when the command line asks for help: the subcommand
	// then prints its usage and flags instead of running.
	help bool
}

// admin runs `sluice admin ARGS`.
func admin(args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 || isHelp(args[0]) {
		out := stderr
		code := 2
		if len(args) > 0 {
			out, code = stdout, 0
		}
		fmt.Fprint(out, adminUsage)
		return code
	}
	c := &adminCmd{fs: flag.NewFlagSet("admin "+args[0], flag.ContinueOnError), stdin: stdin, stdout: stdout, stderr: stderr}
	var rest []string
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			c.help = true
			continue
		}
		rest = append(rest, a)
	}
	args = rest
	c.fs.SetOutput(stderr)
	c.fs.Usage = func() { fmt.Fprint(c.fs.Output(), adminUsage, "\nFlags of ", c.fs.Name(), ":\n"); c.fs.PrintDefaults() }
	c.addr = c.fs.String("addr", "http://127.0.0.1:8080", "server's HTTP address (of --admin-addr when set)")
	c.token = c.fs.String("token", "", "admin token")
	c.getenv = getenv
	switch args[0] {
	case "rules":
		return c.rules(args[1:])
	case "limits":
		return c.limits(args[1:])
	case "tier":
		return c.tier(args[1:])
	case "override":
		return c.override(args[1:])
	case "throttle":
		return c.throttle(args[1:])
	case "audit":
		return c.audit(args[1:])
	case "status":
		if code := c.parse(args[1:], 0); code >= 0 {
			return code
		}
		return c.call("GET", "/api/v1/control/status", nil)
	case "token":
		return c.tokenCmd(args[1:])
	}
	fmt.Fprintf(stderr, "sluice admin: unknown command %q\n\n%s", args[0], adminUsage)
	return 2
}

// parse parses args, flags anywhere among them, wanting n positional
// arguments (-1: any); it returns -1 to go on, else the exit code.
func (c *adminCmd) parse(args []string, n int) int {
	if c.help {
		return c.usage()
	}
	c.fromEnv = envFlags(c.fs, commandEnv(c.fs, "admin", map[string]string{"addr": "SLUICE_ADDR", "token": "SLUICE_TOKEN"}))
	for {
		if code := parseFlags(c.fs, args, c.stdout, c.stderr); code >= 0 {
			return code
		}
		if c.fs.NArg() == 0 {
			break
		}
		c.pos = append(c.pos, c.fs.Arg(0))
		args = c.fs.Args()[1:]
	}
	if err := c.fromEnv(c.getenv); err != nil {
		fmt.Fprintf(c.stderr, "sluice %s: %v\n", c.fs.Name(), err)
		return 2
	}
	if err := checkURLFlags(c.fs); err != nil {
		fmt.Fprintf(c.stderr, "sluice %s: %v\n", c.fs.Name(), err)
		return 2
	}
	if n >= 0 && len(c.pos) != n {
		fmt.Fprintf(c.stderr, "sluice %s: want %d arguments, got %q\n\n%s", c.fs.Name(), n, c.pos, adminUsage)
		return 2
	}
	return -1
}

// kindPath returns the URL path segment of an identity kind.
func kindPath(kind string) (string, error) {
	switch kind {
	case "user", "users":
		return "users", nil
	case "client", "clients":
		return "clients", nil
	case "api_key", "api-key", "api-keys", "api_keys":
		return "api-keys", nil
	}
	return "", fmt.Errorf("kind %q: want user, client or api_key", kind)
}

// identityPath returns /api/v1/KIND/ID for c.pos[0] and c.pos[1].
func (c *adminCmd) identityPath() (string, int) {
	k, err := kindPath(c.pos[0])
	if err != nil {
		fmt.Fprintf(c.stderr, "sluice %s: %v\n", c.fs.Name(), err)
		return "", 2
	}
	return "/api/v1/" + k + "/" + url.PathEscape(c.pos[1]), -1
}

// call sends method path with body (JSON-encoded unless nil or []byte),
// prints the answer and returns the exit code.
func (c *adminCmd) call(method, path string, body any, query ...string) int {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			fmt.Fprintf(c.stderr, "sluice %s: %v\n", c.fs.Name(), err)
			return 2
		}
		rd = bytes.NewReader(data)
	}
	u := strings.TrimRight(*c.addr, "/") + path
	if q := queryOf(query...); q != "" {
		u += "?" + q
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		fmt.Fprintf(c.stderr, "sluice %s: --addr %q: %v\n", c.fs.Name(), *c.addr, err)
		return 2
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if *c.token != "" {
		req.Header.Set("Authorization", "Bearer "+*c.token)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		fmt.Fprintf(c.stderr, "sluice %s: %v\n", c.fs.Name(), err)
		return 3
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	out := c.stdout
	if resp.StatusCode >= 300 {
		out = c.stderr
		fmt.Fprintf(out, "sluice %s: HTTP %d\n", c.fs.Name(), resp.StatusCode)
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, data, "", "  ") == nil {
		data = pretty.Bytes()
	}
	fmt.Fprintln(out, strings.TrimRight(string(data), "\n"))
	if resp.StatusCode >= 300 {
		return 1
	}
	return 0
}

// queryOf returns the URL query of key, value pairs, leaving out empty
// values.
func queryOf(kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	return q.Encode()
}

// sub returns the subcommand of args and the rest, or "" when there is none.
func sub(args []string) (string, []string) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return "", args
	}
	return args[0], args[1:]
}

// usage prints the usage and the flags of the command to stdout and
// returns 0, for --help.
func (c *adminCmd) usage() int {
	envFlags(c.fs, commandEnv(c.fs, "admin", map[string]string{"addr": "SLUICE_ADDR", "token": "SLUICE_TOKEN"}))
	c.fs.SetOutput(c.stdout)
	c.fs.Usage()
	return 0
}

func (c *adminCmd) usageErr(format string, args ...any) int {
	if c.help {
		return c.usage()
	}
	fmt.Fprintf(c.stderr, "sluice %s: %s\n\n%s", c.fs.Name(), fmt.Sprintf(format, args...), adminUsage)
	return 2
}

func (c *adminCmd) rules(args []string) int {
	verb, rest := sub(args)
	version := c.fs.String("version", "", "the rule's current version (If-Match), for put and delete")
	file := c.fs.String("f", "", "file of the rule, YAML or JSON, as in the configuration's rules: (put)")
	reason := c.fs.String("reason", "", "why, for the audit trail")
	switch verb {
	case "list":
		if code := c.parse(rest, 0); code >= 0 {
			return code
		}
		return c.call("GET", "/api/v1/rules", nil)
	case "get", "delete":
		if code := c.parse(rest, 1); code >= 0 {
			return code
		}
		method := map[string]string{"get": "GET", "delete": "DELETE"}[verb]
		return c.call(method, "/api/v1/rules/"+url.PathEscape(c.pos[0]), nil, "version", *version, "reason", *reason)
	case "put":
		if code := c.parse(rest, 0); code >= 0 {
			return code
		}
		if *file == "" {
			return c.usageErr("put needs -f FILE")
		}
		rule, err := readRuleFile(*file)
		if err != nil {
			fmt.Fprintf(c.stderr, "sluice %s: -f %s: %v\n", c.fs.Name(), *file, err)
			return 2
		}
		id, _ := rule["id"].(string)
		if id == "" {
			fmt.Fprintf(c.stderr, "sluice %s: -f %s: the rule has no id\n", c.fs.Name(), *file)
			return 2
		}
		if *reason != "" {
			rule["reason"] = *reason
		}
		return c.call("PUT", "/api/v1/rules/"+url.PathEscape(id), rule, "version", *version)
	}
	return c.usageErr("rules: want list, get, put or delete")
}

// readRuleFile reads one rule from a YAML or JSON file (JSON is YAML).
func readRuleFile(path string) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rule map[string]any
	if err := yaml.Unmarshal(data, &rule); err != nil {
		return nil, err
	}
	if rule == nil {
		return nil, errors.New("empty file")
	}
	return rule, nil
}

func (c *adminCmd) limits(args []string) int {
	if code := c.parse(args, 2); code >= 0 {
		return code
	}
	p, code := c.identityPath()
	if code >= 0 {
		return code
	}
	return c.call("GET", p+"/limits", nil)
}

func (c *adminCmd) tier(args []string) int {
	verb, rest := sub(args)
	reason := c.fs.String("reason", "", "why, for the audit trail")
	version := c.fs.Int64("version", 0, "the identity's current version; 0: whatever it is")
	if verb != "set" {
		return c.usageErr("tier: want set KIND ID TIER")
	}
	if code := c.parse(rest, 3); code >= 0 {
		return code
	}
	p, code := c.identityPath()
	if code >= 0 {
		return code
	}
	return c.call("PUT", p+"/tier", map[string]any{"tier": c.pos[2], "reason": *reason, "version": *version})
}

func (c *adminCmd) override(args []string) int {
	verb, rest := sub(args)
	rule := c.fs.String("rule", "", "id of the rule the override changes (add)")
	limit := c.fs.Int64("limit", 0, "the override's limit (add)")
	window := c.fs.String("window", "", "the override's window, such as 1m; empty: the rule's (add)")
	dur := c.fs.Duration("duration", 0, "how long the override lasts, such as 2h (add)")
	reason := c.fs.String("reason", "", "why, for the audit trail (required by add)")
	switch verb {
	case "list":
		if code := c.parse(rest, 2); code >= 0 {
			return code
		}
		p, code := c.identityPath()
		if code >= 0 {
			return code
		}
		return c.call("GET", p+"/overrides", nil)
	case "add":
		if code := c.parse(rest, 2); code >= 0 {
			return code
		}
		if *rule == "" || *dur <= 0 {
			return c.usageErr("override add needs --rule and --duration")
		}
		p, code := c.identityPath()
		if code >= 0 {
			return code
		}
		return c.call("POST", p+"/override", map[string]any{
			"limits":           map[string]any{*rule: map[string]any{"limit": *limit, "window": *window}},
			"duration_seconds": dur.Seconds(),
			"reason":           *reason,
		})
	case "rm":
		if code := c.parse(rest, 3); code >= 0 {
			return code
		}
		p, code := c.identityPath()
		if code >= 0 {
			return code
		}
		return c.call("DELETE", p+"/override/"+url.PathEscape(c.pos[2]), nil, "reason", *reason)
	}
	return c.usageErr("override: want list, add or rm")
}

func (c *adminCmd) throttle(args []string) int {
	verb, rest := sub(args)
	scope := c.fs.String("scope", "", "global, region or client")
	target := c.fs.String("target", "", "the region or client id of a region or client throttle")
	percent := c.fs.Float64("percent", -1, "how much to cut the limits, 0 to 100")
	dur := c.fs.Duration("duration", 0, "how long the throttle lasts, such as 10m")
	reason := c.fs.String("reason", "", "why, for the audit trail (required)")
	switch verb {
	case "list":
		if code := c.parse(rest, 0); code >= 0 {
			return code
		}
		return c.call("GET", "/api/v1/emergency/throttles", nil)
	case "lift":
		if code := c.parse(rest, 1); code >= 0 {
			return code
		}
		return c.call("DELETE", "/api/v1/emergency/throttle/"+url.PathEscape(c.pos[0]), nil, "reason", *reason)
	case "":
		if code := c.parse(rest, 0); code >= 0 {
			return code
		}
		if *scope == "" || *percent < 0 || *dur <= 0 {
			return c.usageErr("throttle needs --scope, --percent and --duration")
		}
		body := map[string]any{"scope": *scope, "reduction_percent": *percent, "duration_seconds": dur.Seconds(), "reason": *reason}
		if *target != "" {
			body["target"] = *target
		}
		return c.call("POST", "/api/v1/emergency/throttle", body)
	}
	return c.usageErr("throttle: want list, lift ID or flags")
}

func (c *adminCmd) audit(args []string) int {
	object := c.fs.String("object", "", "only changes of this kind: rule, identity, override, throttle, config, token")
	id := c.fs.String("id", "", "only changes of the object with this id")
	actor := c.fs.String("actor", "", "only changes by this token name")
	since := c.fs.String("since", "", "only changes at or after this time, RFC 3339")
	limit := c.fs.String("limit", "", "at most this many entries (1 to 1000; default 100)")
	if code := c.parse(args, 0); code >= 0 {
		return code
	}
	return c.call("GET", "/api/v1/audit", nil, "object", *object, "id", *id, "actor", *actor, "since", *since, "limit", *limit)
}

func (c *adminCmd) tokenCmd(args []string) int {
	verb, rest := sub(args)
	role := c.fs.String("role", "", "viewer, operator or admin (new)")
	name := c.fs.String("name", "", "the entry's name, for the printed tokens-file line (hash)")
	reason := c.fs.String("reason", "", "why, for the audit trail (rm)")
	switch verb {
	case "hash":
		if code := c.parse(rest, 0); code >= 0 {
			return code
		}
		line, err := bufio.NewReader(c.stdin).ReadString('\n')
		tok := strings.TrimSpace(line)
		if tok == "" || (err != nil && !errors.Is(err, io.EOF)) {
			fmt.Fprintf(c.stderr, "sluice %s: want the token on stdin\n", c.fs.Name())
			return 2
		}
		n := *name
		if n == "" {
			n = "NAME"
		}
		r := *role
		if r == "" {
			r = "ROLE"
		}
		fmt.Fprintf(c.stdout, "- {name: %s, role: %s, sha256: %s}\n", n, r, auth.Hash(tok))
		return 0
	case "new":
		if code := c.parse(rest, 1); code >= 0 {
			return code
		}
		if auth.Rank(*role) == 0 {
			return c.usageErr("token new needs --role viewer, operator or admin")
		}
		return c.call("POST", "/api/v1/tokens", map[string]string{"name": c.pos[0], "role": *role})
	case "list":
		if code := c.parse(rest, 0); code >= 0 {
			return code
		}
		return c.call("GET", "/api/v1/tokens", nil)
	case "rm":
		if code := c.parse(rest, 1); code >= 0 {
			return code
		}
		return c.call("DELETE", "/api/v1/tokens/"+url.PathEscape(c.pos[0]), nil, "reason", *reason)
	}
	return c.usageErr("token: want hash, new, list or rm")
}
