package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/sluicehq/sluice/client"
)

const checkUsage = `Usage: sluice check --client-id ID [flags]

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
	addr := fs.String("addr", "http://127.0.0.1:8080", "server's HTTP address")
	var req client.CheckRequest
	fs.StringVar(&req.ClientID, "client-id", "", "client id (required)")
	fs.StringVar(&req.Resource, "resource", "", "resource or endpoint, such as /api/v1/orders")
	fs.StringVar(&req.Operation, "operation", "", "operation: read, write, delete, ...")
	cost := fs.Int64("cost", 1, "cost; 0 reads without consuming")
	fs.StringVar(&req.Priority, "priority", "", "priority: high, normal or low")
	fs.StringVar(&req.IdempotencyKey, "idempotency-key", "", "idempotency key")
	fs.StringVar(&req.User, "user", "", "user")
	fs.StringVar(&req.IP, "ip", "", "client IP address")
	fs.StringVar(&req.APIKey, "api-key", "", "API key")
	fs.StringVar(&req.Method, "method", "", "HTTP method")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	asJSON := fs.Bool("json", false, "print the server's JSON body")
	fromEnv := envFlags(fs, commandEnv(fs, "check", map[string]string{"addr": "SLUICE_ADDR"}))
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
	if req.ClientID == "" {
		fmt.Fprintln(stderr, "sluice check: --client-id is required")
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "sluice check: --timeout %s: want more than 0\n", *timeout)
		return 2
	}
	req.Cost = cost
	c, err := client.New(client.Config{BaseURL: *addr, Timeout: *timeout})
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
