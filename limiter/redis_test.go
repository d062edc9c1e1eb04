package limiter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// redisServer is the package's Redis, started once by TestMain; each test
// keeps its keys apart with a prefix of its own.
var redisServer *redistest.Server

func TestMain(m *testing.M) {
	srv, _, sh, err := redistest.StartShared(false, redistest.ClusterOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	redisServer = srv
	code := m.Run()
	sh.Close()
	os.Exit(code)
}

// newClient returns a rueidis client of addr, closed when the test ends.
func newClient(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// newRedis returns a limiter on the package's Redis whose keys no other
// test shares.
func newRedis(t testing.TB, l sluice.Limit, opts ...RedisOption) *Redis {
	t.Helper()
	opts = append([]RedisOption{WithPrefix(t.Name() + ":")}, opts...)
	lim, err := NewRedis(newClient(t, redisServer.Addr), l, opts...)
	if err != nil {
		t.Fatalf("NewRedis(%+v): %v", l, err)
	}
	return lim
}

// TestRedisExact checks that a limit of n admits exactly n requests at one
// instant, for every algorithm, and that Redis decides as the memory
// limiter does at the same instants.
func TestRedisExact(t *testing.T) {
	const n = 25
	ctx := context.Background()
	for _, a := range sluice.Algorithms {
		t.Run(a.String(), func(t *testing.T) {
			l := sluice.Limit{Algorithm: a, Limit: n, Window: time.Minute}
			rl := newRedis(t, l)
			ml := newLimiter(t, l, Config{})
			for i := range n + 2 {
				got, err := rl.DecideAt(ctx, "u", sec(0), 1)
				if err != nil {
					t.Fatal(err)
				}
				if want := ml.DecideAt("u", sec(0), 1); got != want {
					t.Fatalf("request %d: Redis decided %+v, memory %+v", i+1, got, want)
				}
				if got.Allowed != (i < n) {
					t.Fatalf("request %d of a limit of %d: allowed %v", i+1, n, got.Allowed)
				}
			}
			for _, s := range []int{30, 61, 3600} {
				got, err := rl.DecideAt(ctx, "u", sec(s), 3)
				if err != nil {
					t.Fatal(err)
				}
				if want := ml.DecideAt("u", sec(s), 3); got != want {
					t.Errorf("at %ds: Redis decided %+v, memory %+v", s, got, want)
				}
			}
		})
	}
}

// TestRedisServerClock checks Allow and AllowN, which Redis decides at its
// own clock: PerHour(n) admits exactly n at once, keys apart.
func TestRedisServerClock(t *testing.T) {
	const n = 10
	ctx := context.Background()
	lim := newRedis(t, PerHour(n))
	if got := lim.Limit(); got != PerHour(n) {
		t.Errorf("Limit() = %+v, want %+v", got, PerHour(n))
	}
	admitted := 0
	for range n + 5 {
		ok, err := lim.Allow(ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			admitted++
		}
	}
	if admitted != n {
		t.Errorf("Allow admitted %d of %d requests, want %d", admitted, n+5, n)
	}
	if ok, err := lim.AllowN(ctx, "bob", n); !ok || err != nil {
		t.Errorf("AllowN(bob, %d) = %v, %v; want true: keys do not share state", n, ok, err)
	}
	if ok, err := lim.AllowN(ctx, "carol", n+1); ok || err != nil {
		t.Errorf("AllowN(carol, %d) = %v, %v; want false, nil", n+1, ok, err)
	}
	if ok, err := lim.AllowN(ctx, "carol", -1); ok || err != nil {
		t.Errorf("AllowN(-1) = %v, %v; want false, nil", ok, err)
	}
	d, err := lim.Decide(ctx, "alice", 1)
	if err != nil || d.Allowed || d.Reason != sluice.ReasonLimited || d.RetryAfter <= 0 || d.Limit != n {
		t.Errorf("Decide after the limit = %+v, %v; want denied, limited, with a retry-after and limit %d", d, err, n)
	}
	if err := lim.Reset(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if ok, err := lim.Allow(ctx, "alice"); !ok || err != nil {
		t.Errorf("Allow after Reset = %v, %v; want true", ok, err)
	}
}

// TestRedisConcurrent checks, under the race detector, that goroutines
// sharing keys, each with a limiter and a client of its own (as processes
// would), admit exactly the limit of each key.
func TestRedisConcurrent(t *testing.T) {
	const keys, goroutines, each, n = 5, 8, 50, 20
	ctx := context.Background()
	prefix := WithPrefix(t.Name() + ":")
	var lims [goroutines / 2]*Redis
	for i := range lims {
		var err error
		lims[i], err = NewRedis(newClient(t, redisServer.Addr), PerHour(n), prefix)
		if err != nil {
			t.Fatal(err)
		}
	}
	var admitted [keys]atomic.Int64
	errs := make(chan error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			lim := lims[g%len(lims)]
			for i := range each {
				k := (g + i) % keys
				ok, err := lim.Allow(ctx, fmt.Sprint("key-", k))
				if err != nil {
					errs <- err
					return
				}
				if ok {
					admitted[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range admitted {
		// Every key saw goroutines*each/keys = 80 requests.
		if got := admitted[k].Load(); got != n {
			t.Errorf("key-%d: admitted %d, want %d", k, got, n)
		}
	}
}

// TestRedisDown checks the documented failure: with Redis down a check
// returns false and an error wrapping sluice.ErrStoreUnavailable, within
// the context's deadline; with Redis back, checks are decided again.
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	lim, err := NewRedis(newClient(t, srv.Addr), PerHour(5), WithTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if ok, err := lim.Allow(ctx, "k"); !ok || err != nil {
		t.Fatalf("Allow with Redis up = %v, %v; want true", ok, err)
	}
	srv.Kill()

	start := time.Now()
	ok, err := lim.Allow(ctx, "k")
	if ok || !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("Allow with Redis down = %v, %v; want false and an error wrapping ErrStoreUnavailable", ok, err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Allow with Redis down took %s, want at most the timeout (300ms) and a margin", el)
	}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if d, err := lim.Decide(dctx, "k", 1); d.Allowed || !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("Decide with Redis down = %+v, %v; want denied and ErrStoreUnavailable", d, err)
	}
	if err := lim.Reset(ctx, "k"); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("Reset with Redis down = %v, want ErrStoreUnavailable", err)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		// The restarted server has no state: the key starts again.
		ok, err := lim.Allow(ctx, "k")
		if err == nil {
			if !ok {
				t.Error("first Allow after the restart = false, want true")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Allow 5s after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRedisPrefix checks where the keys go: the default prefix, or the
// one given, and that limiters with different prefixes share nothing.
func TestRedisPrefix(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, redisServer.Addr)
	name := strings.ReplaceAll(t.Name(), "/", "-")
	def, err := NewRedis(c, PerHour(1))
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewRedis(c, PerHour(1), WithPrefix("other:"))
	if err != nil {
		t.Fatal(err)
	}
	for _, lim := range []*Redis{def, other} {
		if ok, err := lim.Allow(ctx, name); !ok || err != nil {
			t.Errorf("first Allow = %v, %v; want true", ok, err)
		}
	}
	for _, key := range []string{DefaultRedisPrefix + name, "other:" + name} {
		n, err := c.Do(ctx, c.B().Exists().Key(key).Build()).AsInt64()
		if err != nil || n != 1 {
			t.Errorf("EXISTS %s = %d, %v; want 1", key, n, err)
		}
		c.Do(ctx, c.B().Del().Key(key).Build())
	}
}

func TestNewRedisInvalid(t *testing.T) {
	c := newClient(t, redisServer.Addr)
	if _, err := NewRedis(nil, PerSecond(1)); err == nil || !strings.Contains(err.Error(), "client") {
		t.Errorf("NewRedis(nil client): error %v, want one naming the client", err)
	}
	if _, err := NewRedis(c, PerSecond(0)); !errors.Is(err, sluice.ErrInvalidLimit) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("NewRedis(PerSecond(0)): error %v, want ErrInvalidLimit naming the limit", err)
	}
	l := sluice.Limit{Algorithm: sluice.SlidingWindowLog, Limit: 1_000_000, Window: time.Second}
	if _, err := NewRedis(c, l); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("NewRedis(a log of a million): error %v, want ErrInvalidLimit", err)
	}
	if _, err := NewRedis(c, PerSecond(1), WithTimeout(-time.Second)); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Errorf("NewRedis(WithTimeout(-1s)): error %v, want one naming the timeout", err)
	}
}

// TestRedisCluster checks that the limiter works on a Redis Cluster as on
// one server: keys spread over the masters, each admitting exactly its
// limit to limiters sharing it.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := redistest.StartCluster(t, redistest.ClusterOptions{})
	const keys, n = 12, 7
	ctx := context.Background()
	var lims [2]*Redis
	for i := range lims {
		client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs(), DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(client.Close)
		if lims[i], err = NewRedis(client, PerHour(n)); err != nil {
			t.Fatal(err)
		}
	}
	for k := range keys {
		key := fmt.Sprint("user-", k)
		admitted := 0
		for i := range 2 * n {
			ok, err := lims[i%2].Allow(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				admitted++
			}
		}
		if admitted != n {
			t.Errorf("%s: admitted %d of %d, want %d", key, admitted, 2*n, n)
		}
	}
}

// BenchmarkRedisAllow measures one check on the package's Redis, from
// parallel callers sharing a limiter: one script call each, pipelined by
// the client. Run with -benchmem for its allocations.
func BenchmarkRedisAllow(b *testing.B) {
	lim := newRedis(b, PerSecond(1_000_000))
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := lim.Allow(ctx, "bench"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
