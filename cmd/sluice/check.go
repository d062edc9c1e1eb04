package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/client"
)

const checkUsage = `Usage: sluice check --client-id ID [flags]
       sluice check --target envoy --domain D --descriptor key=value[,key=value] [flags]

Asks a running server for one decision and prints it. Exits 0 when
allowed, 1 when denied, 2 on usage errors and 3 when the server cannot
answer.

Flags:
`

// check asks a running server for one decision and prints it. It exits 0
// when allowed, 1 when denied, 2 on usage errors and 3 when the server
// cannot answer.
func check(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), checkUsage)
		fs.PrintDefaults()
	}
	target := fs.String("target", "http", "API to ask: http (Sluice's JSON API at --addr) or envoy (Envoy's ShouldRateLimit at --grpc-addr)")
	addr := fs.String("addr", "http://127.0.0.1:8080", "server's HTTP address")
	grpcAddr := fs.String("grpc-addr", "127.0.0.1:8081", "server's gRPC address host:port, of --target envoy")
	domain := fs.String("domain", "", "Envoy domain (--target envoy)")
	var descs descriptors
	fs.Var(&descs, "descriptor", "Envoy descriptor key=value[,key=value...] (--target envoy; repeat it for several descriptors)")
	var req client.CheckRequest
	fs.StringVar(&req.ClientID, "client-id", "", "client id (required by --target http)")
	fs.StringVar(&req.Resource, "resource", "", "resource or endpoint, such as /api/v1/orders")
	fs.StringVar(&req.Operation, "operation", "", "operation: read, write, delete, ...")
	cost := fs.Int64("cost", 1, "cost; 0 reads without consuming (Envoy's hits_addend, where 0 means 1)")
	fs.StringVar(&req.Priority, "priority", "", "priority: high, normal or low")
	fs.StringVar(&req.IdempotencyKey, "idempotency-key", "", "idempotency key")
	fs.StringVar(&req.User, "user", "", "user")
	fs.StringVar(&req.IP, "ip", "", "client IP address")
	fs.StringVar(&req.APIKey, "api-key", "", "API key")
	fs.StringVar(&req.Method, "method", "", "HTTP method")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	token := fs.String("token", "", "token sent as \"Authorization: Bearer TOKEN\", for a server run with --require-check-token")
	asJSON := fs.Bool("json", false, "print the server's JSON body (Envoy's answer in JSON)")
	fromEnv := envFlags(fs, commandEnv(fs, "check", map[string]string{"addr": "SLUICE_ADDR", "token": "SLUICE_TOKEN"}))
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if err := fromEnv(getenv); err != nil {
		fmt.Fprintf(stderr, "sluice check: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice check: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "sluice check: --timeout %s: want more than 0\n", *timeout)
		return 2
	}
	switch *target {
	case "envoy":
		return checkEnvoy(*grpcAddr, *domain, descs, *cost, *timeout, *token, *asJSON, stdout, stderr)
	case "http":
	default:
		fmt.Fprintf(stderr, "sluice check: --target %q: want http or envoy\n", *target)
		return 2
	}
	if req.ClientID == "" {
		fmt.Fprintln(stderr, "sluice check: --client-id is required")
		return 2
	}
	req.Cost = cost
	var hc *http.Client
	if *token != "" {
		hc = &http.Client{Transport: bearer{token: *token, next: http.DefaultTransport}}
	}
	c, err := client.New(client.Config{BaseURL: *addr, Timeout: *timeout, HTTPClient: hc})
	if err != nil {
		fmt.Fprintf(stderr, "sluice check: --addr %q: want http://host:port or https://host:port\n", *addr)
		return 2
	}
	d, err := c.Check(context.Background(), req)
	if err != nil {
		fmt.Fprintf(stderr, "sluice check: %v\n", err)
		if errors.Is(err, client.ErrInvalidRequest) {
			return 2
		}
		return 3
	}
	if *asJSON {
		var v any
		if json.Unmarshal(d.Body, &v) == nil {
			out, _ := json.MarshalIndent(v, "", "  ")
			fmt.Fprintln(stdout, string(out))
		}
	} else {
		verdict := "allowed"
		if !d.Allowed {
			verdict = "denied"
		}
		fmt.Fprintf(stdout, "%s (HTTP %d): rule %q, tier %q, limit %d, remaining %d, resets at %s, source %s",
			verdict, d.Status, d.Rule, d.Tier, d.Limit, d.Remaining, time.Unix(d.ResetAt, 0).UTC().Format(time.RFC3339), d.Source)
		if !d.Allowed && d.RetryAfterMS > 0 {
			fmt.Fprintf(stdout, ", retry after %s", d.RetryAfter())
		}
		fmt.Fprintln(stdout)
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
