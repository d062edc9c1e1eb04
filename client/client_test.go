package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/daemon"
)

// startServer runs a Sluice server on free ports with the built-in policy
// and returns a client for it.
func startServer(t *testing.T) *client.Client {
	t.Helper()
	d, err := daemon.Start(context.Background(), daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	})
	c, err := client.New(client.Config{BaseURL: "http://" + d.HTTPAddr()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCheckStatusBatch(t *testing.T) {
	c := startServer(t)
	ctx := context.Background()
	// The built-in demo rule: 5 per minute per client.
	req := client.CheckRequest{ClientID: "alice", Resource: "/api/v1/demo"}
	for i := range 5 {
		d, err := c.Check(ctx, req)
		if err != nil || !d.Allowed || d.Status != 200 || d.Remaining != int64(4-i) {
			t.Fatalf("check %d: %+v, %v", i+1, d, err)
		}
	}
	d, err := c.Check(ctx, req)
	if err != nil || d.Allowed || d.Status != 429 || d.Rule != "demo" || d.RetryAfter() <= 0 ||
		d.Header.Get("Retry-After") == "" || d.Header.Get("X-RateLimit-Limit") != "5" {
		t.Fatalf("sixth check: %+v, %v; want a 429 with its headers", d, err)
	}
	st, err := c.Status(ctx, client.StatusRequest{ClientID: "alice", Resource: "/api/v1/demo"})
	if err != nil || len(st) == 0 {
		t.Fatalf("status: %v, %v", st, err)
	}
	for _, r := range st {
		if r.Rule == "demo" && r.Remaining != 0 {
			t.Errorf("status of demo: remaining %d, want 0", r.Remaining)
		}
	}
	b, err := c.BatchCheck(ctx, client.BatchRequest{ClientID: "bob", Mode: "best_effort",
		Checks: []client.CheckRequest{{Resource: "/api/v1/demo"}, {Resource: "/api/v1/other"}}})
	if err != nil || len(b.Results) != 2 {
		t.Fatalf("batch: %+v, %v", b, err)
	}
}

// TestStatusOfAnyClientID checks that the status of a client whose id is a
// path's dot segment, or holds a slash, is read like any other.
func TestStatusOfAnyClientID(t *testing.T) {
	c := startServer(t)
	ctx := context.Background()
	for _, id := range []string{".", "..", "a/b", "../x", "%2E", "a?b#c"} {
		if _, err := c.Check(ctx, client.CheckRequest{ClientID: id, Resource: "/api/v1/demo"}); err != nil {
			t.Fatalf("check of %q: %v", id, err)
		}
		st, err := c.Status(ctx, client.StatusRequest{ClientID: id, Resource: "/api/v1/demo"})
		if err != nil {
			t.Errorf("status of %q: %v", id, err)
			continue
		}
		for _, r := range st {
			if r.Rule == "demo" && r.Remaining != 4 {
				t.Errorf("status of %q: demo has %d remaining, want 4", id, r.Remaining)
			}
		}
	}
}

func TestBadRequestIsTyped(t *testing.T) {
	c := startServer(t)
	_, err := c.Check(context.Background(), client.CheckRequest{Resource: "/api/v1/demo"})
	var apiErr *client.APIError
	if !errors.Is(err, client.ErrInvalidRequest) || !errors.As(err, &apiErr) || apiErr.Field != "client_id" {
		t.Fatalf("check without client_id: %v, want ErrInvalidRequest naming client_id", err)
	}
	// JSON cannot carry invalid UTF-8: sent, it would become U+FFFD, and
	// users "\xff" and "\xfe" would share one count.
	_, err = c.Check(context.Background(), client.CheckRequest{ClientID: "a", User: "\xff"})
	if !errors.Is(err, client.ErrInvalidRequest) || !errors.As(err, &apiErr) || apiErr.Field != "user" {
		t.Errorf("check with invalid UTF-8 in user: %v, want ErrInvalidRequest naming user", err)
	}
	_, err = c.BatchCheck(context.Background(), client.BatchRequest{ClientID: "a",
		Checks: []client.CheckRequest{{Resource: "/a"}, {Resource: "/b\xc3"}}})
	if !errors.Is(err, client.ErrInvalidRequest) || !errors.As(err, &apiErr) || apiErr.Field != "checks[1].resource" {
		t.Errorf("batch with invalid UTF-8 in a resource: %v, want ErrInvalidRequest naming checks[1].resource", err)
	}
	_, err = c.BatchCheck(context.Background(), client.BatchRequest{ClientID: "a", IP: "\xfe",
		Checks: []client.CheckRequest{{Resource: "/a"}}})
	if !errors.Is(err, client.ErrInvalidRequest) || !errors.As(err, &apiErr) || apiErr.Field != "ip" {
		t.Errorf("batch with invalid UTF-8 in its ip: %v, want ErrInvalidRequest naming ip", err)
	}
	if _, err := client.New(client.Config{BaseURL: "localhost:8080"}); err == nil {
		t.Error("New with a URL without scheme succeeded")
	}
}

func TestMiddleware(t *testing.T) {
	c := startServer(t)
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	h := client.Middleware(c, func(r *http.Request) client.Identity {
		return client.Identity{ClientID: r.Header.Get("X-Client"), Resource: "/api/v1/demo"}
	}, hello)
	srv := httptest.NewServer(h)
	defer srv.Close()

	get := func(clientID string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/anything", nil)
		if clientID != "" {
			req.Header.Set("X-Client", clientID)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for i := range 5 {
		if resp := get("carol"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != fmt.Sprint(4-i) {
			t.Fatalf("request %d: %d, remaining %q", i+1, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
		}
	}
	if resp := get("carol"); resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("sixth request: %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp := get(""); resp.StatusCode != 400 {
		t.Errorf("no identity: %d, want 400", resp.StatusCode)
	}
}

// TestMiddlewareRefusesBadInput checks that a request the server refuses
// as bad input is answered 400 and never reaches the handler: a refusal is
// not the server being unreachable, and letting it through would let an end
// user skip every limit by sending bad input.
func TestMiddlewareRefusesBadInput(t *testing.T) {
	c := startServer(t)
	for _, tt := range []struct {
		name, path, idemKey string
	}{
		{"control character in the path", "/api/v1/demo%0a", ""},
		{"path over 2048 bytes", "/api/v1/demo/" + strings.Repeat("x", 2100), ""},
		{"path over the server's body limit", "/api/v1/demo/" + strings.Repeat("x", 70000), ""},
		{"idempotency key over 256 bytes", "/api/v1/demo", strings.Repeat("k", 300)},
		{"invalid UTF-8 in the path", "/api/v1/demo/%ff", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			served := 0
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ })
			h := client.Middleware(c, func(r *http.Request) client.Identity {
				return client.Identity{ClientID: "mallory-" + tt.name, IdempotencyKey: tt.idemKey}
			}, next)
			for i := range 20 {
				req := httptest.NewRequest(http.MethodGet, tt.path, nil)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				var body struct {
					Error string `json:"error"`
				}
				if rec.Code != http.StatusBadRequest || rec.Header().Get("Content-Type") != "application/json" ||
					json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Error != "invalid_request" {
					t.Fatalf("request %d: %d %q %s; want 400 invalid_request in JSON", i+1, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
				}
			}
			if served != 0 {
				t.Errorf("handler reached %d times of 20, want 0", served)
			}
		})
	}
}

// TestMiddlewareIdempotencyKey checks that the middleware sends the
// idempotency key the identity function gives, and never the end user's
// X-Idempotency-Key header: one fixed key in that header would replay the
// first allowed decision for free while the handler runs every time.
func TestMiddlewareIdempotencyKey(t *testing.T) {
	c := startServer(t)
	for _, tt := range []struct {
		name    string
		key     string // the identity's IdempotencyKey
		header  string // the end user's X-Idempotency-Key
		allowed int    // of 10 requests to the demo rule (5 per minute)
	}{
		{"header ignored", "", "same", 5},
		{"identity's key", "order-42", "", 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
			h := client.Middleware(c, func(r *http.Request) client.Identity {
				return client.Identity{ClientID: "dave-" + tt.name, IdempotencyKey: tt.key}
			}, next)
			allowed := 0
			for range 10 {
				req := httptest.NewRequest(http.MethodGet, "/api/v1/demo", nil)
				if tt.header != "" {
					req.Header.Set("X-Idempotency-Key", tt.header)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code == http.StatusOK {
					allowed++
				}
			}
			if allowed != tt.allowed {
				t.Errorf("allowed %d of 10, want %d", allowed, tt.allowed)
			}
		})
	}
}

func TestMiddlewareServerDown(t *testing.T) {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	id := func(*http.Request) client.Identity { return client.Identity{ClientID: "x"} }
	for _, failClosed := range []bool{false, true} {
		// A port nothing listens on: the listener is closed at once.
		ln := httptest.NewServer(http.NotFoundHandler())
		addr := ln.URL
		ln.Close()
		c, err := client.New(client.Config{BaseURL: addr, Timeout: 200 * time.Millisecond, FailClosed: failClosed})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		client.Middleware(c, id, hello).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		want := 200
		if failClosed {
			want = 503
		}
		if rec.Code != want {
			t.Errorf("server down, fail closed %v: %d, want %d", failClosed, rec.Code, want)
		}
	}
}

// TestTimeoutWithALaterDeadline: Config.Timeout bounds a call whose
// context has a later deadline.
func TestTimeoutWithALaterDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		case <-time.After(3 * time.Second):
		}
	}))
	defer srv.Close()
	defer close(release)
	c, err := client.New(client.Config{BaseURL: srv.URL, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err = c.Check(ctx, client.CheckRequest{ClientID: "a"})
	took := time.Since(start)
	if !errors.Is(err, client.ErrUnavailable) || took > time.Second {
		t.Fatalf("call took %v (err %v); want cut at Timeout (100ms) since the context's deadline (1m) is later", took, err)
	}
}

// TestLargeBatchAnswer reads a batch's answer of several MiB whole, and
// refuses one past the client's bound with an error that says so rather
// than a decoding error.
func TestLargeBatchAnswer(t *testing.T) {
	rule := `{"rule":"r","limit":10,"remaining":9,"reset_at":1,"algorithm":"fixed_window"}`
	answer := func(rules int) []byte {
		var b strings.Builder
		b.WriteString(`{"allowed":true,"mode":"best_effort","results":[`)
		for i := range 1000 {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"status":200,"allowed":true,"rules":[` + rule + strings.Repeat(","+rule, rules-1) + `]}`)
		}
		b.WriteString(`]}`)
		return []byte(b.String())
	}
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(body)
	}))
	defer srv.Close()
	c, err := client.New(client.Config{BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	req := client.BatchRequest{ClientID: "c", Checks: []client.CheckRequest{{Resource: "/x"}}}

	body = answer(60)
	bd, err := c.BatchCheck(context.Background(), req)
	if err != nil {
		t.Fatalf("an answer of %d MiB: %v", len(body)>>20, err)
	}
	if len(bd.Results) != 1000 || len(bd.Results[999].Rules) != 60 {
		t.Fatalf("%d results", len(bd.Results))
	}

	defer client.SetMaxAnswer(int64(len(body) - 1))()
	if _, err = c.BatchCheck(context.Background(), req); !errors.Is(err, client.ErrServer) || !strings.Contains(err.Error(), "larger than 4 MiB") {
		t.Fatalf("an answer of %d MiB: %v", len(body)>>20, err)
	}
}
