package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
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

// adminCmd is `sluice admin`: the admin API of a running server. Its
// flags, and those of each group of subcommands (rules, tier, ...), are
// taken by every subcommand below them.
type adminCmd struct {
	Addr  string         `name:"addr" default:"http://127.0.0.1:8080" env:"SLUICE_ADDR" help:"server's HTTP address (of --admin-addr when set), http:// or https://"`
	Token string         `name:"token" placeholder:"TOKEN" env:"SLUICE_TOKEN" help:"admin token"`
	TLS   clientTLSFlags `embed:"" group:"TLS to the server"`

	Rules    adminRules    `cmd:"" help:"List, get, put or delete rules."`
	Limits   adminLimits   `cmd:"" help:"Effective limits, tier and overrides of an identity."`
	Tier     adminTier     `cmd:"" help:"Set the tier of an identity."`
	Override adminOverride `cmd:"" help:"List, add or remove the overrides of an identity."`
	Throttle adminThrottle `cmd:"" help:"Throttle (--scope global|region|client [--target T] --percent P --duration D --reason R), list or lift throttles."`
	Audit    adminAudit    `cmd:"" help:"The audit trail of changes."`
	Status   adminStatus   `cmd:"" help:"The control plane's status."`
	Tokens   adminTokens   `cmd:"" name:"token" help:"Hash, create, list or remove admin tokens."`
}

func (adminCmd) Help() string {
	return `The commands and their arguments:

  rules list | get ID | put -f FILE | delete ID [--version N]
  limits KIND ID
  tier set KIND ID TIER [--reason R] [--version N]
  override list KIND ID
  override add KIND ID --rule R --limit N [--window W] --duration D --reason R
  override rm KIND ID OVERRIDE_ID [--reason R]
  throttle --scope global|region|client [--target T] --percent P --duration D --reason R
  throttle list | lift ID [--reason R]
  audit [--object O] [--id ID] [--actor A] [--since RFC3339] [--limit N]
  status
  token hash          read a token on stdin, print its tokens-file sha256 line
  token new NAME --role viewer|operator|admin
  token list | rm NAME

KIND is user, client or api_key. Every command but "token hash" asks the server at --addr with --token. A command exits 0 on success, 1 when the server refuses (its JSON error is printed), 2 on usage errors and 3 when the server cannot be reached.`
}

// identity is the KIND ID arguments of a command about an identity.
type identity struct {
	Kind string `arg:"" help:"user, client or api_key"`
	ID   string `arg:"" name:"id" help:"the identity's id"`
}

// path returns /api/v1/KIND/ID, or the exit code of a kind unknown.
func (id identity) path(inv *invocation) (string, int) {
	k, err := kindPath(id.Kind)
	if err != nil {
		fmt.Fprintf(inv.stderr, "%s: %v\n", inv.name(), err)
		return "", 2
	}
	return "/api/v1/" + k + "/" + url.PathEscape(id.ID), -1
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

type adminRules struct {
	Version string `name:"version" env:"SLUICE_ADMIN_VERSION" help:"the rule's current version (If-Match), for put and delete"`
	F       string `name:"f" short:"f" env:"SLUICE_ADMIN_F" help:"file of the rule, YAML or JSON, as in the configuration's rules: (put)"`
	Reason  string `name:"reason" env:"SLUICE_ADMIN_REASON" help:"why, for the audit trail"`

	List   rulesList   `cmd:"" help:"List the rules."`
	Get    rulesGet    `cmd:"" help:"Print a rule."`
	Put    rulesPut    `cmd:"" help:"Create or replace the rule of -f FILE."`
	Delete rulesDelete `cmd:"" help:"Delete a rule."`
}

type rulesList struct{}

func (rulesList) run(inv *invocation) int {
	return inv.cli.Admin.call(inv, "GET", "/api/v1/rules", nil)
}

type rulesGet struct {
	ID string `arg:"" name:"id" help:"the rule's id"`
}

func (c *rulesGet) run(inv *invocation) int {
	r := &inv.cli.Admin.Rules
	return inv.cli.Admin.call(inv, "GET", "/api/v1/rules/"+url.PathEscape(c.ID), nil, "version", r.Version, "reason", r.Reason)
}

type rulesDelete struct {
	ID string `arg:"" name:"id" help:"the rule's id"`
}

func (c *rulesDelete) run(inv *invocation) int {
	r := &inv.cli.Admin.Rules
	return inv.cli.Admin.call(inv, "DELETE", "/api/v1/rules/"+url.PathEscape(c.ID), nil, "version", r.Version, "reason", r.Reason)
}

type rulesPut struct{}

func (rulesPut) run(inv *invocation) int {
	r := &inv.cli.Admin.Rules
	if r.F == "" {
		return inv.usageError("put needs -f FILE")
	}
	rule, err := readRuleFile(r.F)
	if err != nil {
		fmt.Fprintf(inv.stderr, "%s: -f %s: %v\n", inv.name(), r.F, err)
		return 2
	}
	id, _ := rule["id"].(string)
	if id == "" {
		fmt.Fprintf(inv.stderr, "%s: -f %s: the rule has no id\n", inv.name(), r.F)
		return 2
	}
	if r.Reason != "" {
		rule["reason"] = r.Reason
	}
	return inv.cli.Admin.call(inv, "PUT", "/api/v1/rules/"+url.PathEscape(id), rule, "version", r.Version)
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

type adminLimits struct {
	identity
}

func (c *adminLimits) run(inv *invocation) int {
	p, code := c.path(inv)
	if code >= 0 {
		return code
	}
	return inv.cli.Admin.call(inv, "GET", p+"/limits", nil)
}

type adminTier struct {
	Reason  string `name:"reason" env:"SLUICE_ADMIN_REASON" help:"why, for the audit trail"`
	Version int64  `name:"version" default:"0" env:"SLUICE_ADMIN_VERSION" help:"the identity's current version; 0: whatever it is"`

	Set tierSet `cmd:"" help:"Set the tier of an identity."`
}

type tierSet struct {
	identity
	Tier string `arg:"" help:"the tier's name"`
}

func (c *tierSet) run(inv *invocation) int {
	p, code := c.path(inv)
	if code >= 0 {
		return code
	}
	t := &inv.cli.Admin.Tier
	return inv.cli.Admin.call(inv, "PUT", p+"/tier", map[string]any{"tier": c.Tier, "reason": t.Reason, "version": t.Version})
}

type adminOverride struct {
	Rule     string        `name:"rule" env:"SLUICE_ADMIN_RULE" help:"id of the rule the override changes (add)"`
	Limit    int64         `name:"limit" default:"0" env:"SLUICE_ADMIN_LIMIT" help:"the override's limit (add)"`
	Window   string        `name:"window" env:"SLUICE_ADMIN_WINDOW" help:"the override's window, such as 1m; empty: the rule's (add)"`
	Duration time.Duration `name:"duration" default:"0s" env:"SLUICE_ADMIN_DURATION" help:"how long the override lasts, such as 2h (add)"`
	Reason   string        `name:"reason" env:"SLUICE_ADMIN_REASON" help:"why, for the audit trail (required by add)"`

	List overrideList `cmd:"" help:"List the overrides of an identity."`
	Add  overrideAdd  `cmd:"" help:"Add an override to an identity."`
	Rm   overrideRm   `cmd:"" help:"Remove an override."`
}

type overrideList struct {
	identity
}

func (c *overrideList) run(inv *invocation) int {
	p, code := c.path(inv)
	if code >= 0 {
		return code
	}
	return inv.cli.Admin.call(inv, "GET", p+"/overrides", nil)
}

type overrideAdd struct {
	identity
}

func (c *overrideAdd) run(inv *invocation) int {
	o := &inv.cli.Admin.Override
	if o.Rule == "" || o.Duration <= 0 {
		return inv.usageError("override add needs --rule and --duration")
	}
	p, code := c.path(inv)
	if code >= 0 {
		return code
	}
	return inv.cli.Admin.call(inv, "POST", p+"/override", map[string]any{
		"limits":           map[string]any{o.Rule: map[string]any{"limit": o.Limit, "window": o.Window}},
		"duration_seconds": o.Duration.Seconds(),
		"reason":           o.Reason,
	})
}

type overrideRm struct {
	identity
	OverrideID string `arg:"" name:"override-id" help:"the override's id"`
}

func (c *overrideRm) run(inv *invocation) int {
	p, code := c.path(inv)
	if code >= 0 {
		return code
	}
	return inv.cli.Admin.call(inv, "DELETE", p+"/override/"+url.PathEscape(c.OverrideID), nil, "reason", inv.cli.Admin.Override.Reason)
}

// adminThrottle throttles with its flags alone, or lists or lifts
// throttles.
type adminThrottle struct {
	Scope    string        `name:"scope" env:"SLUICE_ADMIN_SCOPE" help:"global, region or client"`
	Target   string        `name:"target" env:"SLUICE_ADMIN_TARGET" help:"the region or client id of a region or client throttle"`
	Percent  float64       `name:"percent" default:"-1" env:"SLUICE_ADMIN_PERCENT" help:"how much to cut the limits, 0 to 100"`
	Duration time.Duration `name:"duration" default:"0s" env:"SLUICE_ADMIN_DURATION" help:"how long the throttle lasts, such as 10m"`
	Reason   string        `name:"reason" env:"SLUICE_ADMIN_REASON" help:"why, for the audit trail (required)"`

	Apply throttleApply `cmd:"" default:"withargs" hidden:"" help:"Throttle (sluice admin throttle with flags alone)."`
	List  throttleList  `cmd:"" help:"List the throttles."`
	Lift  throttleLift  `cmd:"" help:"Lift a throttle."`
}

type throttleApply struct{}

func (throttleApply) run(inv *invocation) int {
	t := &inv.cli.Admin.Throttle
	if t.Scope == "" || t.Percent < 0 || t.Duration <= 0 {
		return inv.usageError("throttle needs --scope, --percent and --duration")
	}
	body := map[string]any{"scope": t.Scope, "reduction_percent": t.Percent, "duration_seconds": t.Duration.Seconds(), "reason": t.Reason}
	if t.Target != "" {
		body["target"] = t.Target
	}
	return inv.cli.Admin.call(inv, "POST", "/api/v1/emergency/throttle", body)
}

type throttleList struct{}

func (throttleList) run(inv *invocation) int {
	return inv.cli.Admin.call(inv, "GET", "/api/v1/emergency/throttles", nil)
}

type throttleLift struct {
	ID string `arg:"" name:"id" help:"the throttle's id"`
}

func (c *throttleLift) run(inv *invocation) int {
	return inv.cli.Admin.call(inv, "DELETE", "/api/v1/emergency/throttle/"+url.PathEscape(c.ID), nil, "reason", inv.cli.Admin.Throttle.Reason)
}

type adminAudit struct {
	Object string `name:"object" env:"SLUICE_ADMIN_OBJECT" help:"only changes of this kind: rule, identity, override, throttle, config, token"`
	ID     string `name:"id" env:"SLUICE_ADMIN_ID" help:"only changes of the object with this id"`
	Actor  string `name:"actor" env:"SLUICE_ADMIN_ACTOR" help:"only changes by this token name"`
	Since  string `name:"since" env:"SLUICE_ADMIN_SINCE" help:"only changes at or after this time, RFC 3339"`
	Limit  string `name:"limit" env:"SLUICE_ADMIN_LIMIT" help:"at most this many entries (1 to 1000; default 100)"`
}

func (c *adminAudit) run(inv *invocation) int {
	return inv.cli.Admin.call(inv, "GET", "/api/v1/audit", nil, "object", c.Object, "id", c.ID, "actor", c.Actor, "since", c.Since, "limit", c.Limit)
}

type adminStatus struct{}

func (adminStatus) run(inv *invocation) int {
	return inv.cli.Admin.call(inv, "GET", "/api/v1/control/status", nil)
}

type adminTokens struct {
	Role   string `name:"role" env:"SLUICE_ADMIN_ROLE" help:"viewer, operator or admin (new)"`
	Name   string `name:"name" env:"SLUICE_ADMIN_NAME" help:"the entry's name, for the printed tokens-file line (hash)"`
	Reason string `name:"reason" env:"SLUICE_ADMIN_REASON" help:"why, for the audit trail (rm)"`

	Hash tokenHash `cmd:"" help:"Read a token on stdin, print its tokens-file sha256 line."`
	New  tokenNew  `cmd:"" help:"Create a token."`
	List tokenList `cmd:"" help:"List the tokens."`
	Rm   tokenRm   `cmd:"" help:"Remove a token."`
}

type tokenHash struct{}

func (tokenHash) run(inv *invocation) int {
	t := &inv.cli.Admin.Tokens
	line, err := bufio.NewReader(inv.stdin).ReadString('\n')
	tok := strings.TrimSpace(line)
	if tok == "" || (err != nil && !errors.Is(err, io.EOF)) {
		fmt.Fprintf(inv.stderr, "%s: want the token on stdin\n", inv.name())
		return 2
	}
	name, role := t.Name, t.Role
	if name == "" {
		name = "NAME"
	}
	if role == "" {
		role = "ROLE"
	}
	fmt.Fprintf(inv.stdout, "- {name: %s, role: %s, sha256: %s}\n", name, role, auth.Hash(tok))
	return 0
}

type tokenNew struct {
	Name string `arg:"" name:"name" help:"the token's name"`
}

func (c *tokenNew) run(inv *invocation) int {
	role := inv.cli.Admin.Tokens.Role
	if auth.Rank(role) == 0 {
		return inv.usageError("token new needs --role viewer, operator or admin")
	}
	return inv.cli.Admin.call(inv, "POST", "/api/v1/tokens", map[string]string{"name": c.Name, "role": role})
}

type tokenList struct{}

func (tokenList) run(inv *invocation) int {
	return inv.cli.Admin.call(inv, "GET", "/api/v1/tokens", nil)
}

type tokenRm struct {
	Name string `arg:"" name:"name" help:"the token's name"`
}

func (c *tokenRm) run(inv *invocation) int {
	return inv.cli.Admin.call(inv, "DELETE", "/api/v1/tokens/"+url.PathEscape(c.Name), nil, "reason", inv.cli.Admin.Tokens.Reason)
}

// call sends method path with body (JSON-encoded unless nil or []byte),
// prints the answer and returns the exit code.
func (c *adminCmd) call(inv *invocation, method, path string, body any, query ...string) int {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			fmt.Fprintf(inv.stderr, "%s: %v\n", inv.name(), err)
			return 2
		}
		rd = bytes.NewReader(data)
	}
	u := strings.TrimRight(c.Addr, "/") + path
	if q := queryOf(query...); q != "" {
		u += "?" + q
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		fmt.Fprintf(inv.stderr, "%s: --addr %q: %v\n", inv.name(), c.Addr, err)
		return 2
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	tc, err := c.TLS.config()
	if err != nil {
		fmt.Fprintf(inv.stderr, "%s: %v\n", inv.name(), err)
		return 2
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: tc, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		fmt.Fprintf(inv.stderr, "%s: %v\n", inv.name(), err)
		return 3
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	out := inv.stdout
	if resp.StatusCode >= 300 {
		out = inv.stderr
		fmt.Fprintf(out, "%s: HTTP %d\n", inv.name(), resp.StatusCode)
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
