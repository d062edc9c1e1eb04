package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
)

// redisAddr is the address of a Redis: in these examples, a redis-server
// that the package's tests start; in an application, its own Redis, such
// as "127.0.0.1:6379".
func redisAddr() string { return limiter.RedisAddrForExamples() }

// A limiter shared by every process that uses the same Redis: 100 requests
// per minute per user, with bursts of up to 100.
func ExampleNewRedis() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{redisAddr()}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	lim, err := limiter.NewRedis(client, limiter.PerMinute(100))
	if err != nil {
		log.Fatal(err)
	}
	ok, err := lim.Allow(context.Background(), "user:42")
	if errors.Is(err, sluice.ErrStoreUnavailable) {
		// Redis is down or slow: admit (fail open) or refuse, as the
		// application prefers.
		ok = true
	}
	fmt.Println("allowed:", ok)
	// Output: allowed: true
}

// Reserve takes units that are not there yet and says when they are: with
// 5 a minute, the first 5 at once, then one every 12 s, for every process
// sharing the Redis.
func ExampleRedis_Reserve() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{redisAddr()}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lim, err := limiter.NewRedis(client, limiter.PerMinute(5), limiter.WithPrefix("example:reserve:"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	_ = lim.Reset(ctx, "export") // start afresh

	for range 7 {
		r, err := lim.Reserve(ctx, "export")
		if err != nil {
			log.Fatal(err) // Redis cannot answer
		}
		fmt.Println("act in", r.Delay().Round(time.Second))
		// A real program would wait, time.Sleep(r.Delay()), and act.
	}
	// Output:
	// act in 0s
	// act in 0s
	// act in 0s
	// act in 0s
	// act in 0s
	// act in 12s
	// act in 24s
}

// Wait blocks until the request may go through: a crawler fetching at most
// 20 pages a second from one host, whatever the number of its processes.
func ExampleRedis_Wait() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{redisAddr()}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lim, err := limiter.NewRedis(client, limiter.PerSecond(20), limiter.WithPrefix("example:wait:"))
	if err != nil {
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fetched := 0
	for range 25 {
		if err := lim.Wait(ctx, "host:example.org"); err != nil {
			log.Fatal(err) // the deadline, or Redis cannot answer
		}
		fetched++ // fetch a page
	}
	fmt.Println("fetched", fetched, "pages")
	// Output: fetched 25 pages
}

// Another algorithm, another burst, and a prefix of its own, so that it
// shares a Redis with other limiters: the limit is a plain value.
func ExampleNewRedis_options() {
	var client rueidis.Client // an existing client

	l := limiter.PerSecond(10)
	l.Burst = 50 // up to 50 at once after a pause, 10 a second on average
	api, err := limiter.NewRedis(client, l, limiter.WithPrefix("api:"))
	if err != nil {
		log.Fatal(err)
	}

	login, err := limiter.NewRedis(client, sluice.Limit{
		Algorithm: sluice.SlidingWindowCounter, // at most 5 in any 15 minutes
		Limit:     5,
		Window:    15 * time.Minute,
	}, limiter.WithPrefix("login:"))
	if err != nil {
		log.Fatal(err)
	}
	_, _ = api, login
}

// Decide returns the whole decision, for the rate-limit headers of an
// answer; package httplimit writes them for an http.Handler.
func ExampleRedis_Decide() {
	var lim *limiter.Redis // from NewRedis

	http.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		d, err := lim.Decide(r.Context(), r.Header.Get("X-API-Key"), 1)
		if err != nil {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		if !d.Allowed {
			http.Error(w, fmt.Sprint("too many requests; retry in ", d.RetryAfter), http.StatusTooManyRequests)
			return
		}
		fmt.Fprintf(w, "ok, %d left\n", d.Remaining)
	})
}
