package daemon_test

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/guard"
	"github.com/sluicehq/sluice/internal/guard/guardtest"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// The bursts of these tests: burstLimit per hour, checked burstChecks
// times at once over two daemons. An hour rather than a minute: a burst
// that straddles the turn of a fixed window is admitted twice, and a
// bucket refills one unit every 36 s rather than every 0.6 s.
const (
	burstLimit  = 100
	burstChecks = 1000
	// guardDeadline is the store deadline of daemons started with
	// default settings.
	guardDeadline = guard.DefaultDeadline
)

// exactPolicy has one rule per algorithm, on resource /<algorithm>, with
// no failure mode and no flag: Sluice's defaults.
func exactPolicy() string {
	var b strings.Builder
	b.WriteString("version: 1\nrules:\n")
	for _, a := range sluice.Algorithms {
		fmt.Fprintf(&b, "  - { id: %s, match: { resource: /%s }, dimension: client, algorithm: %s, limit: %d, window: 1h }\n", a, a, a, burstLimit)
	}
	return b.String()
}

// exactEnvoyConfig is the same in envoyproxy/ratelimit's format: one
// descriptor per algorithm, selected with Sluice's `algorithm` extension
// (fixed_window being that format's own).
func exactEnvoyConfig() string {
	var b strings.Builder
	b.WriteString("domain: exact\ndescriptors:\n")
	for _, a := range sluice.Algorithms {
		fmt.Fprintf(&b, "  - key: %s\n    rate_limit: { unit: hour, requests_per_unit: %d", a, burstLimit)
		if a != sluice.FixedWindow {
			fmt.Fprintf(&b, ", algorithm: %s", a)
		}
		b.WriteString(" }\n")
	}
	return b.String()
}

// startPair starts two daemons on storeURL with default settings (and
// the wall clock, which a store's deadline runs on) on the native policy
// and two on the Envoy file.
func startPair(t *testing.T, storeURL string) (native, envoy []*testDaemon) {
	t.Helper()
	envoyPath := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(envoyPath, []byte(exactEnvoyConfig()), 0o644); err != nil {
		t.Fatal(err)
	}
	onStore := func(c *daemon.Config) { c.StoreURL = storeURL; c.Now = nil }
	onEnvoy := func(c *daemon.Config) { c.ConfigPath = envoyPath }
	for range 2 {
		native = append(native, start(t, exactPolicy(), onStore))
		envoy = append(envoy, start(t, "", onStore, onEnvoy))
	}
	return native, envoy
}

// burst is what a burst of checks got.
type burst struct {
	admitted int
	sources  map[string]int // of the admitted checks, "source/reason"
	statuses map[string]int // every answer's HTTP status or gRPC code
	latency  []time.Duration
}

func (b *burst) String() string {
	return fmt.Sprintf("admitted %d; admitted by source %v; answers %v", b.admitted, b.sources, b.statuses)
}

// p99 returns the 99th percentile of the decision latencies the daemons
// reported, 0 when they reported none.
func (b *burst) p99() time.Duration {
	if len(b.latency) == 0 {
		return 0
	}
	slices.Sort(b.latency)
	return b.latency[len(b.latency)*99/100]
}

// fire runs n calls at once, each on a goroutine of its own: all are
// started and waiting before one close releases them.
func fire(n int, call func(i int)) {
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	for i := range n {
		ready.Add(1)
		done.Go(func() {
			ready.Done()
			<-release
			call(i)
		})
	}
	ready.Wait()
	close(release)
	done.Wait()
}

// burstHTTP sends burstChecks checks of client on resource at once over
// ds through POST /api/v1/check.
func burstHTTP(t *testing.T, ds []*testDaemon, client, resource string) *burst {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: burstChecks}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	body := []byte(`{"client_id":"` + client + `","resource":"` + resource + `"}`)
	b := &burst{sources: map[string]int{}, statuses: map[string]int{}}
	var mu sync.Mutex
	fire(burstChecks, func(i int) {
		resp, err := hc.Post(ds[i%len(ds)].base+"/api/v1/check", "application/json", bytes.NewReader(body))
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			b.statuses[err.Error()]++
			return
		}
		resp.Body.Close()
		b.statuses[strconv.Itoa(resp.StatusCode)]++
		if us, err := strconv.ParseInt(resp.Header.Get("X-Ratelimit-Decision-Latency-Us"), 10, 64); err == nil {
			b.latency = append(b.latency, time.Duration(us)*time.Microsecond)
		}
		if resp.StatusCode == http.StatusOK {
			b.admitted++
			src := resp.Header.Get("X-Ratelimit-Decision-Source")
			if r := resp.Header.Get("X-Ratelimit-Fallback-Reason"); r != "" {
				src += "/" + r
			}
			b.sources[src]++
		}
	})
	return b
}

// burstEnvoy sends burstChecks Envoy checks of descriptor key=value at
// once over ds, four connections per daemon.
func burstEnvoy(t *testing.T, ds []*testDaemon, key, value string) *burst {
	t.Helper()
	var clients []rlsv3.RateLimitServiceClient
	for _, d := range ds {
		for range 4 {
			clients = append(clients, rlsv3.NewRateLimitServiceClient(dial(t, d.GRPCAddr())))
		}
	}
	b := &burst{sources: map[string]int{}, statuses: map[string]int{}}
	var mu sync.Mutex
	fire(burstChecks, func(i int) {
		resp, err := clients[i%len(clients)].ShouldRateLimit(t.Context(), envoyReq("exact", 1, []string{key, value}))
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			b.statuses[err.Error()]++
			return
		}
		b.statuses[resp.GetOverallCode().String()]++
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			b.admitted++
		}
	})
	return b
}

// storeDecided returns the decisions of ds's metrics taken without the
// store: sluice_store_fallbacks_total, summed over the daemons.
func storeFallbacks(t *testing.T, ds []*testDaemon) float64 {
	t.Helper()
	sum := 0.0
	for _, d := range ds {
		for name, v := range scrape(t, d.base+"/metrics") {
			if strings.HasPrefix(name, "sluice_store_fallbacks_total{") {
				sum += v
			}
		}
	}
	return sum
}

// awayFromTheHour waits, when the wall clock is within 10 s of the turn
// of an hour, until it has turned: a fixed window's burst must fall in
// one window.
func awayFromTheHour() {
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 10*time.Second {
		time.Sleep(left + time.Second)
	}
}

// TestBurstExactByDefault is the burst of a new user: two daemons on one
// Redis with default settings, 1000 checks at once on a limit of 100, for
// every algorithm, from a native policy (HTTP API) and from an
// envoyproxy/ratelimit file (Envoy's gRPC API). Exactly 100 are admitted,
// every one of them by the store; then the same through a proxy that
// adds 20 ms to every Redis answer (a Redis in another zone is not an
// outage).
func TestBurstExactByDefault(t *testing.T) {
	srv := redistest.Start(t)
	proxy := guardtest.StartProxy(t, srv.Addr)
	for _, via := range []struct {
		name, url string
		latency   int
	}{
		{"direct", "redis://" + srv.Addr, 0},
		{"latency-20ms", "redis://" + proxy.Addr(), 20},
	} {
		t.Run(via.name, func(t *testing.T) {
			native, envoy := startPair(t, via.url)
			if via.latency > 0 {
				proxy.Latency(t, via.latency)
				defer proxy.Clear(t)
			}
			for _, a := range sluice.Algorithms {
				client := via.name + "-" + a.String()
				t.Run("native/"+a.String(), func(t *testing.T) {
					awayFromTheHour()
					b := burstHTTP(t, native, client, "/"+a.String())
					if b.admitted != burstLimit || b.sources["store"] != b.admitted {
						t.Errorf("%s; want exactly %d, all by the store", b, burstLimit)
					}
				})
				t.Run("envoy/"+a.String(), func(t *testing.T) {
					awayFromTheHour()
					b := burstEnvoy(t, envoy, a.String(), client)
					if b.admitted != burstLimit {
						t.Errorf("%s; want exactly %d", b, burstLimit)
					}
				})
			}
			if n := storeFallbacks(t, append(native, envoy...)); n != 0 {
				t.Errorf("sluice_store_fallbacks_total = %v over the bursts, want 0", n)
			}
		})
	}
}

// TestBurstRedisKilled: the same bursts with the daemons' Redis killed.
// Every check is answered, within the deadline, without an error: each daemon admits
// at most its local share of the limit (the limit divided by the rule's
// expected_instances, 1 by default, per window), and says so: source
// local, reason unreachable or breaker_open.
func TestBurstRedisKilled(t *testing.T) {
	srv := redistest.Start(t)
	native, envoy := startPair(t, "redis://"+srv.Addr)
	// A reference from the same run: the decision latency of the same
	// burst with Redis up. On a machine shared with other tests a
	// thousand request goroutines wait for the CPU, and that wait is
	// inside the decision latency too.
	awayFromTheHour()
	ref := burstHTTP(t, native, "reference", "/"+sluice.FixedWindow.String()).p99()
	srv.Kill()
	const bound = 2 * burstLimit // two daemons, each with the whole limit
	for _, a := range sluice.Algorithms {
		t.Run("native/"+a.String(), func(t *testing.T) {
			awayFromTheHour()
			b := burstHTTP(t, native, "killed", "/"+a.String())
			if b.admitted > bound || b.admitted == 0 || b.statuses["200"]+b.statuses["429"] != burstChecks {
				t.Errorf("%s; want at most %d admitted, every answer 200 or 429", b, bound)
			}
			for src := range b.sources {
				if !strings.HasPrefix(src, "local/") {
					t.Errorf("%d checks admitted by %q, want local/<reason>", b.sources[src], src)
				}
			}
			if p, limit := b.p99(), max(guardDeadline, 2*ref); p > limit {
				t.Errorf("p99 of the decision latency = %s, want at most %s (the store deadline, or twice the p99 of the burst with Redis up, %s)", p, limit, ref)
			} else {
				t.Logf("p99 of the decision latency %s (with Redis up: %s)", p, ref)
			}
		})
		t.Run("envoy/"+a.String(), func(t *testing.T) {
			awayFromTheHour()
			b := burstEnvoy(t, envoy, a.String(), "killed")
			if b.admitted > bound || b.admitted == 0 || b.statuses["OK"]+b.statuses["OVER_LIMIT"] != burstChecks {
				t.Errorf("%s; want at most %d admitted, every answer OK or OVER_LIMIT", b, bound)
			}
		})
	}
	if n := storeFallbacks(t, append(native, envoy...)); n < burstChecks {
		t.Errorf("sluice_store_fallbacks_total = %v, want every check of the bursts", n)
	}
	// Each answer says it was decided without the store, and why: the
	// JSON (check and rules), Sluice's gRPC answer, and the events.
	r := native[0].check(t, `{"client_id":"answers","resource":"/gcra"}`)
	rule, _ := r.body["rules"].([]any)
	if r.str("source") != "local" || r.str("fallback_reason") == "" || len(rule) != 1 || rule[0].(map[string]any)["fallback_reason"] != r.str("fallback_reason") {
		t.Errorf("HTTP answer with Redis killed: %s; want source local and a fallback_reason, in the rule too", r.raw)
	}
	resp, err := sluicev1.NewRateLimiterClient(dial(t, native[0].GRPCAddr())).CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "answers", Resource: "/gcra"})
	if err != nil || resp.GetSource() != "local" || resp.GetFallbackReason() == "" || len(resp.GetRules()) != 1 || resp.GetRules()[0].GetFallbackReason() == "" {
		t.Errorf("gRPC answer with Redis killed: %v, %v; want source local and a fallback_reason, in the rule too", resp, err)
	}
	ev := get(t, native[0].base+"/api/v1/events?type=store_fallback")
	evs, _ := ev.body["events"].([]any)
	if len(evs) == 0 {
		t.Fatalf("no store_fallback event: %d %s", ev.status, ev.raw)
	}
	if e := evs[0].(map[string]any); e["source"] != "local" || e["reason"] == nil || e["rule"] == nil {
		t.Errorf("store_fallback event = %v, want its rule, source local and a reason", e)
	}
}

// TestSourcesOfTheOtherRules: when the over-limit cache denies one rule of
// a check, the other rules were not decided by the store either: their
// source is the cache's, in the answer and in sluice_decisions_total.
// With Redis killed and the breaker open, every rule says local, reason
// breaker_open.
func TestSourcesOfTheOtherRules(t *testing.T) {
	srv := redistest.Start(t)
	td := start(t, `version: 1
rules:
  - { id: tight, match: { resource: /two }, dimension: client, algorithm: fixed_window, limit: 1, window: 1h }
  - { id: wide,  match: { resource: /two }, dimension: client, algorithm: fixed_window, limit: 1000, window: 1h }
`, func(c *daemon.Config) { c.StoreURL = "redis://" + srv.Addr; c.Now = nil })
	awayFromTheHour()
	sources := func(r *response) map[string]string {
		got := map[string]string{}
		rules, _ := r.body["rules"].([]any)
		for _, x := range rules {
			m := x.(map[string]any)
			got[m["rule"].(string)] = fmt.Sprint(m["source"], "/", m["fallback_reason"])
		}
		return got
	}
	body := `{"client_id":"two","resource":"/two"}`
	for i, want := range []map[string]string{
		{"tight": "store/<nil>", "wide": "store/<nil>"},                       // admitted
		{"tight": "store/<nil>", "wide": "store/<nil>"},                       // tight denies, with a retry-after
		{"tight": "over_limit_cache/<nil>", "wide": "over_limit_cache/<nil>"}, // the cache denies: wide was not sent
	} {
		r := td.check(t, body)
		if got := sources(r); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("check %d: sources %v, want %v (%s)", i, got, want, r.raw)
		}
	}
	m := scrape(t, td.base+"/metrics")
	if v := m[`sluice_decisions_total{result="allowed",rule="wide",source="over_limit_cache"}`]; v != 1 {
		t.Errorf(`sluice_decisions_total{rule="wide",source="over_limit_cache"} = %v, want 1`, v)
	}
	srv.Kill()
	if _, ok := waitFor(10*time.Second, func() bool {
		td.check(t, `{"client_id":"other","resource":"/two"}`)
		return td.Guard().BreakerState() == guard.BreakerOpen
	}); !ok {
		t.Fatalf("the breaker did not open in 10 s with Redis killed")
	}
	r := td.check(t, `{"client_id":"other","resource":"/two"}`)
	if got := sources(r); got["tight"] != "local/breaker_open" || got["wide"] != "local/breaker_open" {
		t.Errorf("breaker open: sources %v, want local/breaker_open for both (%s)", got, r.raw)
	}
}
