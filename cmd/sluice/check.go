package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/client"
)

// checkCmd asks a running server for one decision and prints it. It exits
// 0 when allowed, 1 when denied, 2 on usage errors and 3 when the server
// cannot answer.
type checkCmd struct {
	Target         string        `name:"target" default:"http" env:"SLUICE_CHECK_TARGET" help:"API to ask: http (Sluice's JSON API at --addr) or envoy (Envoy's ShouldRateLimit at --grpc-addr)"`
	Addr           string        `name:"addr" default:"http://127.0.0.1:8080" env:"SLUICE_ADDR" help:"server's HTTP address, http:// or https://"`
	GRPCAddr       string        `name:"grpc-addr" default:"127.0.0.1:8081" env:"SLUICE_CHECK_GRPC_ADDR" help:"server's gRPC address host:port, of --target envoy"`
	Domain         string        `name:"domain" placeholder:"DOMAIN" env:"SLUICE_CHECK_DOMAIN" help:"Envoy domain (--target envoy)"`
	Descriptors    descriptors   `name:"descriptor" placeholder:"KEY=VALUE,..." env:"SLUICE_CHECK_DESCRIPTOR" help:"Envoy descriptor key=value[,key=value...] (--target envoy; repeat it for several descriptors)"`
	ClientID       string        `name:"client-id" placeholder:"ID" env:"SLUICE_CHECK_CLIENT_ID" help:"client id (required by --target http)"`
	Resource       string        `name:"resource" env:"SLUICE_CHECK_RESOURCE" help:"resource or endpoint, such as /api/v1/orders"`
	Operation      string        `name:"operation" env:"SLUICE_CHECK_OPERATION" help:"operation: read, write, delete, ..."`
	Cost           int64         `name:"cost" default:"1" env:"SLUICE_CHECK_COST" help:"cost; 0 reads without consuming (Envoy's hits_addend, where 0 means 1)"`
	Priority       string        `name:"priority" env:"SLUICE_CHECK_PRIORITY" help:"priority: high, normal or low"`
	IdempotencyKey string        `name:"idempotency-key" env:"SLUICE_CHECK_IDEMPOTENCY_KEY" help:"idempotency key"`
	User           string        `name:"user" env:"SLUICE_CHECK_USER" help:"user"`
	IP             string        `name:"ip" env:"SLUICE_CHECK_IP" help:"client IP address"`
	APIKey         string        `name:"api-key" env:"SLUICE_CHECK_API_KEY" help:"API key"`
	Method         string        `name:"method" env:"SLUICE_CHECK_METHOD" help:"HTTP method"`
	Timeout        time.Duration `name:"timeout" default:"2s" env:"SLUICE_CHECK_TIMEOUT" help:"how long to wait for the answer"`
	Token          string        `name:"token" placeholder:"TOKEN" env:"SLUICE_TOKEN" help:"token sent as \"Authorization: Bearer TOKEN\", for a server run with --require-check-token"`
	JSON           bool          `name:"json" env:"SLUICE_CHECK_JSON" help:"print the server's JSON body (Envoy's answer in JSON)"`

	TLSOn bool           `name:"tls" env:"SLUICE_CHECK_TLS" help:"speak TLS to --grpc-addr (--target envoy), as to a server run with --tls-cert; on by itself with --tls-ca, --tls-client-cert or --insecure-skip-verify (--target http speaks it to an https:// --addr)"`
	TLS   clientTLSFlags `embed:"" group:"TLS to the server"`
}

func (checkCmd) Help() string {
	return `Asks a running server for one decision and prints it:

  sluice check --client-id ID [flags]
  sluice check --target envoy --domain D --descriptor key=value[,key=value] [flags]

Exits 0 when allowed, 1 when denied, 2 on usage errors and 3 when the server cannot answer.`
}

func (c *checkCmd) run(inv *invocation) int {
	if c.Timeout <= 0 {
		fmt.Fprintf(inv.stderr, "sluice check: --timeout %s: want more than 0\n", c.Timeout)
		return 2
	}
	switch c.Target {
	case "envoy":
		return c.envoy(inv)
	case "http":
	default:
		fmt.Fprintf(inv.stderr, "sluice check: --target %q: want http or envoy\n", c.Target)
		return 2
	}
	if c.ClientID == "" {
		fmt.Fprintln(inv.stderr, "sluice check: --client-id is required")
		return 2
	}
	tc, err := c.TLS.config()
	if err != nil {
		fmt.Fprintf(inv.stderr, "sluice check: %v\n", err)
		return 2
	}
	var rt http.RoundTripper = &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: tc, ForceAttemptHTTP2: true}
	if c.Token != "" {
		rt = bearer{token: c.Token, next: rt}
	}
	cl, err := client.New(client.Config{BaseURL: c.Addr, Timeout: c.Timeout, HTTPClient: &http.Client{Transport: rt}})
	if err != nil {
		fmt.Fprintf(inv.stderr, "sluice check: --addr %q: want http://host:port or https://host:port\n", c.Addr)
		return 2
	}
	cost := c.Cost
	req := client.CheckRequest{ClientID: c.ClientID, Resource: c.Resource, Operation: c.Operation, Cost: &cost,
		Priority: c.Priority, IdempotencyKey: c.IdempotencyKey, User: c.User, IP: c.IP, APIKey: c.APIKey, Method: c.Method}
	d, err := cl.Check(context.Background(), req)
	if err != nil {
		fmt.Fprintf(inv.stderr, "sluice check: %v\n", err)
		if errors.Is(err, client.ErrInvalidRequest) {
			return 2
		}
		return 3
	}
	if c.JSON {
		var v any
		if json.Unmarshal(d.Body, &v) == nil {
			out, _ := json.MarshalIndent(v, "", "  ")
			fmt.Fprintln(inv.stdout, string(out))
		}
	} else {
		verdict := "allowed"
		if !d.Allowed {
			verdict = "denied"
		}
		fmt.Fprintf(inv.stdout, "%s (HTTP %d): rule %q, tier %q, limit %d, remaining %d, resets at %s, source %s",
			verdict, d.Status, d.Rule, d.Tier, d.Limit, d.Remaining, time.Unix(d.ResetAt, 0).UTC().Format(time.RFC3339), d.Source)
		if !d.Allowed && d.RetryAfterMS > 0 {
			fmt.Fprintf(inv.stdout, ", retry after %s", d.RetryAfter())
		}
		fmt.Fprintln(inv.stdout)
	}
	if !d.Allowed {
		return 1
	}
	return 0
}

// bearer sends its token as the Authorization of every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
