package redispool

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/internal/reserve/reservetest"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// The package's servers, started once by TestMain: a standalone Redis
// and a Redis Cluster of three masters. Each test has its own key prefix.
var (
	standalone *redistest.Server
	cluster    *redistest.Cluster
)

func TestMain(m *testing.M) {
	srv, c, sh, err := redistest.StartShared(true, redistest.ClusterOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	standalone, cluster = srv, c
	code := m.Run()
	sh.Close()
	os.Exit(code)
}

// servers are the two deployments every test runs on.
var servers = []struct {
	name  string
	addrs func() []string
}{
	{"Redis", func() []string { return []string{standalone.Addr} }},
	{"Cluster", func() []string {
		var a []string
		for _, s := range cluster.Masters {
			a = append(a, s.Addr)
		}
		return a
	}},
}

// newClient returns a client of addrs, closed when the test ends.
func newClient(t testing.TB, addrs []string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// prefixes numbers the tests' key prefixes, so that a test run again on
// the same servers (-count) starts afresh.
var prefixes atomic.Int64

// testPrefix returns a key prefix of the test's own.
func testPrefix(t testing.TB) string {
	return fmt.Sprintf("t%d:%s:", prefixes.Add(1), strings.ReplaceAll(t.Name(), "/", ":"))
}

// newPools returns Pools on c with a prefix of the test's own.
func newPools(t testing.TB, c rueidis.Client) *Pools {
	t.Helper()
	p, err := New(Config{Client: c, Prefix: testPrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConformance(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			c := newClient(t, s.addrs())
			reservetest.Run(t, func(t *testing.T) reserve.Backend { return newPools(t, c) })
		})
	}
}

// TestRedisDown: with its Redis gone, every operation fails with an
// error wrapping sluice.ErrStoreUnavailable (503 on the HTTP API), within
// the Keeper's timeout.
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	p := newPools(t, newClient(t, []string{srv.Addr}))
	k, _ := reservetest.NewKeeper(t, p, reservetest.NewClock().Now, 10)
	res, err := k.Reserve(reservetest.Ask("a", 1, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	start := time.Now()
	if _, err := k.Reserve(reservetest.Ask("a", 1, time.Minute)); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("Reserve: %v, want ErrStoreUnavailable", err)
	}
	if _, err := k.Get("a", res.ID); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("Get: %v, want ErrStoreUnavailable", err)
	}
	if _, err := k.Release("a", res.ID); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Errorf("Release: %v, want ErrStoreUnavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("three failing calls took %s", d)
	}
}
