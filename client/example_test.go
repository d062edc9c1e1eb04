package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/daemon"
)

// startExampleServer starts a Sluice server in process on free ports, with
// the built-in policy, as `sluice serve` would; it returns the server's
// HTTP address and a function that stops it. A real program talks to a
// server it does not start, such as "http://127.0.0.1:8080".
//
// The server's clock stands still at the start of a minute, so that the
// demo rule's one-minute window cannot roll over in the middle of an
// example and change its output.
func startExampleServer() (baseURL string, stop func()) {
	start := time.Unix(1_800_000_000, 0).Truncate(time.Minute)
	d, err := daemon.Start(context.Background(), daemon.Config{
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0",
		Now:      func() time.Time { return start },
	})
	if err != nil {
		log.Fatal(err)
	}
	return "http://" + d.HTTPAddr(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}
}

// The built-in policy's demo rule admits 5 checks per minute per client.
func ExampleClient_Check() {
	baseURL, stop := startExampleServer()
	defer stop()

	c, err := client.New(client.Config{BaseURL: baseURL})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for range 6 {
		d, err := c.Check(ctx, client.CheckRequest{ClientID: "acme", Resource: "/api/v1/demo"})
		if err != nil {
			log.Fatal(err) // bad input, or the server cannot be reached
		}
		if !d.Allowed {
			// d.RetryAfter() says how long to wait.
			fmt.Println(d.Status, d.Error, "on rule", d.Rule, "limit", d.Header.Get("X-RateLimit-Limit"))
			continue
		}
		fmt.Println(d.Status, "remaining", d.Remaining)
	}
	// Output:
	// 200 remaining 4
	// 200 remaining 3
	// 200 remaining 2
	// 200 remaining 1
	// 200 remaining 0
	// 429 rate_limit_exceeded on rule demo limit 5
}

// A reservation books tokens of the demo rule's pool (5 per minute) for a
// while; checks that carry its ID draw from it without touching the limit,
// and releasing it returns what was not used, once.
func ExampleClient_Reserve() {
	baseURL, stop := startExampleServer()
	defer stop()

	c, err := client.New(client.Config{BaseURL: baseURL})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	r, err := c.Reserve(ctx, client.ReserveRequest{ClientID: "acme", Resource: "/api/v1/demo", TokensNeeded: 3, DurationSeconds: 60})
	if err != nil {
		log.Fatal(err) // bad input (errors.Is(err, client.ErrInvalidRequest)), a full queue, ...
	}
	fmt.Println(r.Status, r.Tokens, "until", r.ExpiresAt.Format(time.TimeOnly))

	d, err := c.Check(ctx, client.CheckRequest{ClientID: "acme", Resource: "/api/v1/demo", ReservationID: r.ID})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Status, d.Source, "remaining", d.Remaining)

	rel, err := c.ReleaseReservation(ctx, client.ReservationRef{ID: r.ID, ClientID: "acme"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rel.Status, "returned", rel.TokensReturned)
	_, err = c.ReleaseReservation(ctx, client.ReservationRef{ID: r.ID, ClientID: "acme"})
	fmt.Println(errors.Is(err, client.ErrReservationNotFound))
	// Output:
	// granted 3 until 08:01:00
	// 200 reservation remaining 2
	// released returned 2
	// true
}

// Middleware rate-limits an http.Handler: the identity function says who
// is calling; the resource and method default to the request's path and
// method.
func ExampleMiddleware() {
	baseURL, stop := startExampleServer()
	defer stop()

	c, err := client.New(client.Config{BaseURL: baseURL})
	if err != nil {
		log.Fatal(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })
	identity := func(r *http.Request) client.Identity {
		return client.Identity{ClientID: r.Header.Get("X-Client-ID")}
	}
	h := client.Middleware(c, identity, hello)

	// A real program serves h with http.ListenAndServe; a test server here.
	srv := httptest.NewServer(h)
	defer srv.Close()
	for range 6 {
		req, _ := http.NewRequest("GET", srv.URL+"/api/v1/demo", nil)
		req.Header.Set("X-Client-ID", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body = body[:len(`{"status":429`)] // the server's JSON decision
		}
		fmt.Println(resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), string(body))
	}
	// Output:
	// 200 4 hello
	// 200 3 hello
	// 200 2 hello
	// 200 1 hello
	// 200 0 hello
	// 429 0 {"status":429
}

// Example_readme is the README's example, word for word after its first
// two lines. It has no Output comment, so it is compiled but not run: it
// serves forever.
func Example_readme() {
	ctx := context.Background()
	myHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") })

	c, err := client.New(client.Config{BaseURL: "http://127.0.0.1:8080"})
	if err != nil {
		log.Fatal(err)
	}

	// One check.
	d, err := c.Check(ctx, client.CheckRequest{ClientID: "acme", Resource: "/api/v1/demo"})
	if err != nil {
		log.Fatal(err) // bad input, or the server cannot be reached
	}
	if !d.Allowed {
		fmt.Println("denied by", d.Rule, "- retry in", d.RetryAfter())
	}

	// Or a middleware: the identity function says who is calling; the resource and
	// method are the request's path and method. Denied requests get 429 with the
	// rate-limit headers and Sluice's JSON body.
	h := client.Middleware(c, func(r *http.Request) client.Identity {
		return client.Identity{ClientID: r.Header.Get("X-Client-ID")}
	}, myHandler)
	log.Fatal(http.ListenAndServe(":8000", h))
}
