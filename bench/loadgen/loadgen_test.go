package loadgen_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bench/loadgen"
	"github.com/sluicehq/sluice/internal/daemon"
)

// testPolicy limits each client (and each Envoy descriptor value in
// domain "load") to 20 per minute in fixed windows.
const testPolicy = `version: 1
rules:
  - id: per-client
    match: { resource: "/api/*" }
    dimension: client
    algorithm: fixed_window
    limit: 20
    window: 1m
envoy:
  - domain: load
    descriptors:
      - key: client_id
        rate_limit: { unit: minute, requests_per_unit: 20 }
`

// start runs a daemon of testPolicy on free loopback ports and stops it
// when the test ends.
func start(t *testing.T) *daemon.Daemon {
	t.Helper()
	return startPolicy(t, testPolicy)
}

// startPolicy runs a daemon of policy on free loopback ports and stops it
// when the test ends.
func startPolicy(t *testing.T, policy string, mod ...func(*daemon.Config)) *daemon.Daemon {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", ConfigPath: path}
	for _, m := range mod {
		m(&cfg)
	}
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	})
	return d
}

func TestRunAgainstDaemon(t *testing.T) {
	d := start(t)
	for _, tt := range []struct {
		target string
		addr   string
		batch  int
		client string
	}{
		{loadgen.TargetHTTP, d.HTTPAddr(), 0, ""},
		{loadgen.TargetGRPC, d.GRPCAddr(), 0, ""},
		{loadgen.TargetEnvoy, d.GRPCAddr(), 0, ""},
		{loadgen.TargetHTTP, d.HTTPAddr(), 4, ""},
		{loadgen.TargetGRPC, d.GRPCAddr(), 4, ""},
		{loadgen.TargetGRPC, d.GRPCAddr(), 0, loadgen.ClientGRPCGo},
		{loadgen.TargetEnvoy, d.GRPCAddr(), 0, loadgen.ClientGRPCGo},
		{loadgen.TargetGRPC, d.GRPCAddr(), 4, loadgen.ClientGRPCGo},
		{loadgen.TargetGRPC, d.GRPCAddr(), 0, loadgen.ClientXNet},
		{loadgen.TargetEnvoy, d.GRPCAddr(), 0, loadgen.ClientXNet},
		{loadgen.TargetGRPC, d.GRPCAddr(), 4, loadgen.ClientXNet},
	} {
		name := tt.target
		if tt.batch > 0 {
			name += "-batch"
		}
		if tt.client != "" {
			name += "-" + tt.client
		}
		t.Run(name, func(t *testing.T) {
			// Each subtest has its own keys, so that counts start at zero.
			prefix := name + "-"
			const requests, keys, limit = 200, 3, 20
			rep, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: tt.target, Addr: tt.addr, Concurrency: 4, Requests: requests, Duration: 30 * time.Second,
				Keys: keys, KeyPrefix: prefix, Resource: "/api/v1/orders", Domain: "load", Batch: tt.batch, GRPCClient: tt.client,
				ExpectLimit: limit, Window: time.Minute,
				// Every request is answered: what is checked is the
				// count, not the time (on a loaded machine an answer
				// can take over the default second).
				Timeout: 30 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Errors != 0 || rep.Requests != requests {
				t.Fatalf("requests %d errors %d (%v), want %d and 0", rep.Requests, rep.Errors, rep.ErrorSamples, requests)
			}
			if rep.Overshoot == nil || rep.Overshoot.Total != 0 {
				t.Errorf("overshoot = %+v, want none", rep.Overshoot)
			}
			// In one window exactly the limit is admitted per key; a run
			// across a minute boundary may admit up to twice that.
			per := int64(max(tt.batch, 1))
			most := keys * limit * rep.Overshoot.Windows
			if rep.AdmittedCost < keys*limit || rep.AdmittedCost > most {
				t.Errorf("admitted %d units, want %d to %d", rep.AdmittedCost, keys*limit, most)
			}
			if rep.Allowed*per != rep.AdmittedCost || rep.Denied != requests-rep.Allowed {
				t.Errorf("allowed %d denied %d admitted %d: inconsistent", rep.Allowed, rep.Denied, rep.AdmittedCost)
			}
			if rep.Latency == nil {
				t.Fatal("no latency figures")
			}
			if rep.Latency.P50 <= 0 || rep.Latency.P50 > rep.Latency.P99 || rep.Latency.P99 > rep.Latency.Max {
				t.Errorf("latency %+v: want 0 < p50 <= p99 <= max", rep.Latency)
			}
			var b strings.Builder
			rep.Text(&b)
			for _, want := range []string{"allowed", "p99", "overshoot"} {
				if !strings.Contains(b.String(), want) {
					t.Errorf("text report lacks %q:\n%s", want, b.String())
				}
			}
		})
	}
}

// TestLargeRequests sends batches of 100 checks on a long resource, about
// 21 KB a request: more than the 16 KiB a DATA frame may carry unless the
// server allows larger ones, so the lean client splits each request.
func TestLargeRequests(t *testing.T) {
	d := start(t)
	for _, client := range []string{loadgen.ClientH2, loadgen.ClientXNet, loadgen.ClientGRPCGo} {
		t.Run(client, func(t *testing.T) {
			const requests = 3
			rep, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: loadgen.TargetGRPC, Addr: d.GRPCAddr(), GRPCClient: client, Concurrency: 1, Requests: requests,
				Duration: 30 * time.Second, Batch: 100, Resource: "/api/" + strings.Repeat("x", 200), KeyPrefix: "large-" + client + "-",
			})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Errors != 0 || rep.Requests != requests {
				t.Errorf("requests %d errors %d (%v), want %d and 0", rep.Requests, rep.Errors, rep.ErrorSamples, requests)
			}
		})
	}
}

// TestMoreCallersThanTheServerAllowsPerConnection: the server allows 1024
// calls at once on a connection. The lean client does not queue calls past
// that bound, so it refuses before the run a number of callers per
// connection the server would refuse calls of, naming the connections needed.
func TestMoreCallersThanTheServerAllowsPerConnection(t *testing.T) {
	d := start(t)
	_, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: loadgen.TargetEnvoy, Addr: d.GRPCAddr(), Domain: "load", Concurrency: 2100, Conns: 2, Requests: 1,
	})
	if err == nil || !strings.Contains(err.Error(), "give conns 3 or more") {
		t.Errorf("2100 callers over 2 connections: %v", err)
	}
	if !errors.Is(err, loadgen.ErrInvalidConfig) {
		t.Errorf("2100 callers over 2 connections: %v is not ErrInvalidConfig: the server was reached, and --conns is what to change", err)
	}
	rep, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: loadgen.TargetEnvoy, Addr: d.GRPCAddr(), Domain: "load", Concurrency: 2048, Conns: 2, Requests: 2048,
		Duration: 30 * time.Second, KeyPrefix: "streams-",
		// The 2048 calls are sent at once: the last are answered after
		// the others, seconds later on a loaded machine with -race. A
		// call the server refused would fail at once whatever the
		// timeout, so a generous one keeps what the test proves.
		Timeout: 30 * time.Second,
	})
	if err != nil || rep.Errors != 0 {
		t.Fatalf("2048 callers over 2 connections: %v, %d errors (%v)", err, rep.Errors, rep.ErrorSamples)
	}
}

// TestServerGoesAway stops the server in the middle of a run: the calls
// fail, and the run ends on time.
func TestServerGoesAway(t *testing.T) {
	for _, client := range []string{loadgen.ClientH2, loadgen.ClientXNet, loadgen.ClientGRPCGo} {
		t.Run(client, func(t *testing.T) {
			d := start(t)
			go func() {
				time.Sleep(300 * time.Millisecond)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				d.Shutdown(ctx)
			}()
			began := time.Now()
			rep, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: loadgen.TargetEnvoy, Addr: d.GRPCAddr(), Concurrency: 8, Duration: 1500 * time.Millisecond,
				Keys: 1000, KeyPrefix: "away-", Domain: "load", GRPCClient: client, Timeout: 200 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(began); took > 5*time.Second {
				t.Errorf("run took %s, want about 1.5s", took)
			}
			if rep.Allowed == 0 || rep.Errors == 0 {
				t.Errorf("allowed %d errors %d: want both before and after the shutdown", rep.Allowed, rep.Errors)
			}
		})
	}
}

func TestFixedRateAndZipf(t *testing.T) {
	if testing.Short() {
		t.Skip("timed run")
	}
	d := start(t)
	// 40 callers, one request each every 100 ms: the schedule holds as
	// long as an answer takes less than that on average, which 4 callers
	// (one every 10 ms) did not on a loaded machine (93 requests).
	rep, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: loadgen.TargetGRPC, Addr: d.GRPCAddr(), Concurrency: 40, Rate: 400, Duration: time.Second,
		Keys: 1000, Zipf: true, KeyPrefix: "zipf-", Resource: "/api/v1/orders", Costs: []loadgen.Cost{{1, 9}, {5, 1}},
		Timeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	// 400/s for 1s: never more than the schedule, and at least half of it.
	if rep.Requests < 200 || rep.Requests > 420 || rep.Errors != 0 {
		t.Errorf("fixed rate 400/s for 1s: %d requests, %d errors", rep.Requests, rep.Errors)
	}
	// Zipf concentrates on the first keys: key 0's limit of 20 is hit.
	if rep.Denied == 0 {
		t.Errorf("zipf run: no denial, want the hottest keys limited")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []loadgen.Config{
		{Addr: ""},
		{Addr: "127.0.0.1:1", Target: "smtp"},
		{Addr: "127.0.0.1:1", Concurrency: -1},
		{Addr: "127.0.0.1:1", Duration: 2 * time.Hour},
		{Addr: "127.0.0.1:1", Zipf: true, ZipfS: 0.5},
		{Addr: "127.0.0.1:1", Target: loadgen.TargetEnvoy, Batch: 3},
		{Addr: "127.0.0.1:1", Target: loadgen.TargetGRPC, GRPCClient: "curl"},
		{Addr: "127.0.0.1:1", Timeout: -time.Second},
		// Addresses that no request can go to: refused before the run,
		// not counted as the errors of every request for its duration.
		{Addr: "ftp://127.0.0.1:1", Duration: 100 * time.Millisecond},
		{Addr: "http://", Duration: 100 * time.Millisecond},
		{Addr: "http://[::1", Duration: 100 * time.Millisecond},
		{Addr: "http://127.0.0.1:1/?x=1", Duration: 100 * time.Millisecond},
		{Addr: "http://127.0.0.1:1", Target: loadgen.TargetGRPC},
		{Addr: "127.0.0.1", Target: loadgen.TargetEnvoy},
		// Weights whose sum overflows: a panic of every caller's draw.
		{Addr: "127.0.0.1:1", Duration: 100 * time.Millisecond, Costs: []loadgen.Cost{{1, math.MaxInt64}, {2, math.MaxInt64}}},
	} {
		if _, err := loadgen.Run(context.Background(), cfg); !errors.Is(err, loadgen.ErrInvalidConfig) {
			t.Errorf("Run(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestParseCosts(t *testing.T) {
	got, err := loadgen.ParseCosts("1:90, 5:9,10:1")
	if err != nil || len(got) != 3 || got[1] != (loadgen.Cost{Cost: 5, Weight: 9}) {
		t.Errorf("ParseCosts = %v, %v", got, err)
	}
	if got, err := loadgen.ParseCosts("7"); err != nil || len(got) != 1 || got[0] != (loadgen.Cost{Cost: 7, Weight: 1}) {
		t.Errorf("ParseCosts(7) = %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "1:0", "-1", "1:y"} {
		if _, err := loadgen.ParseCosts(bad); err == nil {
			t.Errorf("ParseCosts(%q): no error", bad)
		}
	}
}

// TestErrorSamplesSayWhy sends checks the server refuses (a cost above
// its 2^30): the error samples carry the server's reason, on every
// target, not a bare status.
func TestErrorSamplesSayWhy(t *testing.T) {
	d := start(t)
	for _, tt := range []struct{ target, addr string }{
		{loadgen.TargetHTTP, d.HTTPAddr()},
		{loadgen.TargetGRPC, d.GRPCAddr()},
	} {
		t.Run(tt.target, func(t *testing.T) {
			rep, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: tt.target, Addr: tt.addr, Concurrency: 1, Requests: 2, Duration: 10 * time.Second,
				KeyPrefix: "why-", Costs: []loadgen.Cost{{Cost: 1 << 31, Weight: 1}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Errors != 2 || len(rep.ErrorSamples) != 1 || !strings.Contains(rep.ErrorSamples[0], "cost") {
				t.Errorf("errors %d, samples %q: want 2 errors and the server's reason, naming the cost", rep.Errors, rep.ErrorSamples)
			}
		})
	}
}

// TestEnvoyCostAboveUint32 asks for a cost Envoy's hits_addend (a uint32)
// cannot carry: refused, where it used to be sent truncated (2^32+1 as 1)
// and counted whole, as if the server had admitted 2^32+1.
func TestEnvoyCostAboveUint32(t *testing.T) {
	d := start(t)
	rep, err := loadgen.Run(context.Background(), loadgen.Config{
		Target: loadgen.TargetEnvoy, Addr: d.GRPCAddr(), Domain: "load", Concurrency: 1, Requests: 1,
		KeyPrefix: "uint32-", Costs: []loadgen.Cost{{Cost: 1<<32 + 1, Weight: 1}},
	})
	if err == nil {
		t.Errorf("cost 2^32+1 to Envoy: no error; report: allowed %d, admitted %d", rep.Allowed, rep.AdmittedCost)
	}
}

// TestVeryLowRate runs at one request per 10^12 seconds: the first
// caller sends one request at the start and nothing else is due. The
// interval between a caller's requests overflowed time.Duration and the
// run went at full speed, closed loop.
func TestVeryLowRate(t *testing.T) {
	d := start(t)
	rep, err := loadgen.Run(context.Background(), loadgen.Config{
		Addr: d.HTTPAddr(), Concurrency: 2, Rate: 1e-12, Duration: 300 * time.Millisecond, KeyPrefix: "slow-",
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 1 {
		t.Errorf("%d requests, want 1", rep.Requests)
	}
}

// TestAdmittedIsWhatTheServerAdmitted ends runs in the middle of their
// traffic, on one key whose limit is never reached: the cost the report
// says was admitted is what the server consumed, the requests in flight
// at the end included. They used to be abandoned uncounted, though the
// server had decided them, which hid as much over-admission.
func TestAdmittedIsWhatTheServerAdmitted(t *testing.T) {
	const limit = 100_000_000
	d := startPolicy(t, fmt.Sprintf(`version: 1
rules:
  - id: big
    match: { resource: "/api/*" }
    dimension: client
    algorithm: sliding_window_counter
    limit: %d
    window: 1h
envoy:
  - domain: load
    descriptors:
      - key: client_id
        rate_limit: { unit: hour, requests_per_unit: %d }
`, limit, limit))
	for _, tt := range []struct {
		target, addr string
		rate         float64
	}{
		{loadgen.TargetHTTP, d.HTTPAddr(), 0},
		{loadgen.TargetGRPC, d.GRPCAddr(), 0},
		{loadgen.TargetHTTP, d.HTTPAddr(), 20000},
		{loadgen.TargetGRPC, d.GRPCAddr(), 20000},
	} {
		name := fmt.Sprintf("%s-rate%g", tt.target, tt.rate)
		t.Run(name, func(t *testing.T) {
			prefix := name + "-"
			rep, err := loadgen.Run(context.Background(), loadgen.Config{
				Target: tt.target, Addr: tt.addr, Rate: tt.rate, Concurrency: 32, Duration: 300 * time.Millisecond,
				Keys: 1, KeyPrefix: prefix, Resource: "/api/v1/orders", Costs: []loadgen.Cost{{Cost: 1, Weight: 1}, {Cost: 3, Weight: 1}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Errors != 0 {
				t.Fatalf("%d errors: %v", rep.Errors, rep.ErrorSamples)
			}
			resp, err := http.Get("http://" + d.HTTPAddr() + "/api/v1/status/" + prefix + "0?resource=/api/v1/orders")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var status struct{ Limits []struct{ Remaining int64 } }
			if err := json.NewDecoder(resp.Body).Decode(&status); err != nil || len(status.Limits) != 1 {
				t.Fatalf("status: %v, %+v", err, status)
			}
			if consumed := limit - status.Limits[0].Remaining; rep.AdmittedCost != consumed {
				t.Errorf("report: %d admitted in %d requests; the server consumed %d", rep.AdmittedCost, rep.Requests, consumed)
			}
		})
	}
}

// TestAllAtOnce sends one burst of 200 requests on one key of limit 20 per
// minute (in fixed windows aligned on the epoch: a burst that straddles
// the minute may be admitted twice), over each target: each caller sends
// one request, and the report says what the server admitted.
func TestAllAtOnce(t *testing.T) {
	d := start(t)
	for _, target := range []string{loadgen.TargetHTTP, loadgen.TargetGRPC, loadgen.TargetEnvoy} {
		t.Run(target, func(t *testing.T) {
			addr := d.GRPCAddr()
			if target == loadgen.TargetHTTP {
				addr = d.HTTPAddr()
			}
			rep, err := loadgen.Run(t.Context(), loadgen.Config{Target: target, Addr: addr, Domain: "load", AllAtOnce: true,
				Concurrency: 200, Keys: 1, KeyPrefix: "burst-" + target, Resource: "/api/burst", ExpectLimit: 20, Window: time.Minute,
				// 200 connections opened at once under -race on a busy machine
				// can take longer than the default second to be answered.
				Timeout: 15 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests != 200 || rep.Errors != 0 || !rep.AllAtOnce {
				t.Errorf("requests %d, errors %d %v, all at once %v; want 200, none", rep.Requests, rep.Errors, rep.ErrorSamples, rep.AllAtOnce)
			}
			if want := 20 * rep.Overshoot.Windows; rep.Allowed != want {
				t.Errorf("admitted %d of the burst, want %d (%d windows)", rep.Allowed, want, rep.Overshoot.Windows)
			}
			var b strings.Builder
			rep.Text(&b)
			if !strings.Contains(b.String(), "burst       ") {
				t.Errorf("report without the burst line:\n%s", b.String())
			}
		})
	}
}

// TestResources spreads checks over three resources of a rule each: key k
// consumes from the rule of resource k mod 3 and from no other.
func TestResources(t *testing.T) {
	const limit = 1_000_000
	var policy strings.Builder
	policy.WriteString("version: 1\nrules:\n")
	for i := range 3 {
		fmt.Fprintf(&policy, "  - { id: r%d, match: { resource: \"/api/s/%d\" }, dimension: client, algorithm: fixed_window, limit: %d, window: 1h }\n", i, i, limit)
	}
	d := startPolicy(t, policy.String())
	for _, target := range []string{loadgen.TargetHTTP, loadgen.TargetGRPC} {
		t.Run(target, func(t *testing.T) {
			addr := d.GRPCAddr()
			if target == loadgen.TargetHTTP {
				addr = d.HTTPAddr()
			}
			prefix := "spread-" + target + "-"
			rep, err := loadgen.Run(t.Context(), loadgen.Config{Target: target, Addr: addr, Concurrency: 4, Requests: 300,
				Keys: 6, KeyPrefix: prefix, Resource: "/api/s", Resources: 3})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Errors != 0 || rep.Allowed != 300 {
				t.Fatalf("allowed %d, errors %d %v; want 300, none", rep.Allowed, rep.Errors, rep.ErrorSamples)
			}
			for k := range 6 {
				for res := range 3 {
					resp, err := http.Get(fmt.Sprintf("http://%s/api/v1/status/%s%d?resource=/api/s/%d", d.HTTPAddr(), prefix, k, res))
					if err != nil {
						t.Fatal(err)
					}
					var status struct{ Limits []struct{ Remaining int64 } }
					err = json.NewDecoder(resp.Body).Decode(&status)
					resp.Body.Close()
					if err != nil || len(status.Limits) != 1 {
						t.Fatalf("status: %v, %+v", err, status)
					}
					if used := status.Limits[0].Remaining < limit; used != (res == k%3) {
						t.Errorf("key %d, resource %d: consumed %v, want %v", k, res, used, res == k%3)
					}
				}
			}
		})
	}
	if _, err := loadgen.Run(t.Context(), loadgen.Config{Addr: d.HTTPAddr(), Resources: 3, Batch: 2}); !errors.Is(err, loadgen.ErrInvalidConfig) {
		t.Errorf("resources with batches: %v, want ErrInvalidConfig", err)
	}
}

// Progress receives the counts so far while the run goes on, never
// falling, and last the run's own counts; over several regions, the sum
// of theirs.
func TestProgress(t *testing.T) {
	if testing.Short() {
		t.Skip("timed run")
	}
	d := start(t)
	// The interval, from a reference taken in the same run: at least
	// twice the slowest of 20 answers, so that the first report counts
	// one on a loaded machine too (100 ms on an idle one, at most 2 s).
	ref, err := loadgen.Run(context.Background(), loadgen.Config{Addr: d.HTTPAddr(), Concurrency: 2, Requests: 20,
		KeyPrefix: "progress-ref-", Resource: "/api/v1/orders", Timeout: 30 * time.Second})
	if err != nil || ref.Latency == nil {
		t.Fatalf("reference run: %v", err)
	}
	every := min(max(100*time.Millisecond, 2*time.Duration(ref.Latency.Max*float64(time.Millisecond))), 2*time.Second)
	for _, addr := range []string{d.HTTPAddr(), d.HTTPAddr() + "," + d.HTTPAddr()} {
		var seen []loadgen.Progress // written by Run's progress goroutine only
		cfg := loadgen.Config{Addr: addr, Concurrency: 2, Rate: 400, Duration: 7 * every, Timeout: 30 * time.Second,
			KeyPrefix: "progress-", Resource: "/api/v1/orders",
			ProgressInterval: every, Progress: func(p loadgen.Progress) { seen = append(seen, p) }}
		var rep *loadgen.Report
		var err error
		if strings.Contains(addr, ",") {
			rs, _ := loadgen.ParseRegions(addr, "")
			rep, _, err = loadgen.RunRegions(context.Background(), cfg, rs)
		} else {
			rep, err = loadgen.Run(context.Background(), cfg)
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(seen) < 4 {
			t.Fatalf("%s: %d progress calls in %s at %s, want about 7", addr, len(seen), cfg.Duration, every)
		}
		for i := 1; i < len(seen); i++ {
			if seen[i].Requests < seen[i-1].Requests || seen[i].Elapsed < seen[i-1].Elapsed {
				t.Errorf("%s: progress went back: %+v then %+v", addr, seen[i-1], seen[i])
			}
		}
		last := seen[len(seen)-1]
		if last.Requests != rep.Requests || last.Allowed != rep.Allowed || last.Denied != rep.Denied || last.Errors != rep.Errors {
			t.Errorf("%s: last progress %+v, report %d requests %d allowed %d denied %d errors", addr, last, rep.Requests, rep.Allowed, rep.Denied, rep.Errors)
		}
		if seen[0].Requests == 0 {
			t.Errorf("%s: first progress %+v counts no request", addr, seen[0])
		}
	}
}
