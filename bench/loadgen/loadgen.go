// Package loadgen is Sluice's load generator, behind the sluice-load
// binary. It drives a running server through its HTTP JSON API, its gRPC API or
// Envoy's ShouldRateLimit, with a number of concurrent callers (closed
// loop) or at a fixed rate (open loop), for a bounded time and number of
// requests, over a set of keys (client ids, or descriptor values for
// Envoy) drawn uniformly or from a Zipf distribution, with a mix of costs.
//
// It reports throughput, allowed and denied counts, errors and latency
// percentiles, and counts the cost admitted per key, so that it can report
// the overshoot over a limit the caller knows (Config.ExpectLimit).
//
// The gRPC and Envoy targets go through a lean HTTP/2 client of the
// package's own (see h2Conn) unless Config.GRPCClient asks for
// golang.org/x/net/http2's Transport or grpc-go's: on a small machine a
// load generator that costs as much CPU per call as the server it measures
// halves what it can show. Measured in one run against one sluice serve on
// the memory store (2 cores, 64 callers over 2 connections, one thread,
// medians of three 10 s runs), x/net/http2's Transport took 68 µs of the
// load generator's CPU per Envoy check against the lean client's 10 (60
// against 9 on the gRPC API) and reached 0.33x its checks per second (0.45x
// on gRPC): it writes each request's frames with system calls of their own,
// where the lean client gathers those of concurrent calls.
//
// The lean client does not reconnect: when the server closes the
// connection, the calls on it fail and are counted as errors; in a closed
// loop their callers then stop, and the run ends when every caller has. Nor does it send a request in parts
// as a stream's flow-control window opens: a request larger than the
// server's initial stream window, or than its connection window with
// nothing in flight (64 KiB unless the server grants more; Sluice's gRPC
// server grants 1 MiB), fails with an error that says so; the other two
// clients send it. Requests larger than the server's largest frame go out
// in several DATA frames.
//
// When Duration is over no request is sent any more, and those in flight
// are waited for and counted, so that the admitted cost (and the
// overshoot) is what the server admitted; Elapsed includes that wait.
//
// Latency is that of the answered requests (allowed or denied), as wrk
// reports it: a failed request, timeouts included, is counted as an error
// and left out of the percentiles, where a quick refusal would make a
// failing server look fast. In fixed-rate mode each caller sends on its own
// schedule and latency is measured from the instant a request was due,
// not from when it was sent, so a stalled server shows in the percentiles
// of the requests it answers late (no coordinated omission), and in the
// errors of those it does not answer within Config.Timeout.
package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The targets.
const (
	// TargetHTTP posts to /api/v1/check (or /api/v1/batch-check).
	TargetHTTP = "http"
	// TargetGRPC calls sluice.v1.RateLimiter/CheckRateLimit (or BatchCheck).
	TargetGRPC = "grpc"
	// TargetEnvoy calls envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit.
	TargetEnvoy = "envoy"
)

// The gRPC clients.
const (
	// ClientH2 is the load generator's lean HTTP/2 client (see h2Conn).
	ClientH2 = "h2"
	// ClientGRPCGo is grpc-go's client.
	ClientGRPCGo = "grpc-go"
	// ClientXNet is golang.org/x/net/http2's Transport.
	ClientXNet = "x-net"
)

// Bounds on a run.
const (
	// MaxDuration is the longest run.
	MaxDuration = time.Hour
	// MaxConcurrency is the most concurrent callers.
	MaxConcurrency = 10_000
	// MaxKeys is the most distinct keys.
	MaxKeys = 10_000_000
	// MaxBatch is the most checks per batch.
	MaxBatch = 100
)

// Cost is one entry of a cost mix: Cost is drawn with probability
// proportional to Weight.
type Cost struct {
	Cost, Weight int64
}

// ParseCosts parses a cost mix such as "1:90,5:9,10:1" (cost:weight); a
// bare "5" is cost 5 always.
func ParseCosts(s string) ([]Cost, error) {
	var out []Cost
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		c, w, found := strings.Cut(part, ":")
		cost, err := strconv.ParseInt(c, 10, 64)
		if err != nil || cost < 0 {
			return nil, fmt.Errorf("loadgen: costs: %q: cost must be a whole number >= 0", part)
		}
		weight := int64(1)
		if found {
			if weight, err = strconv.ParseInt(w, 10, 64); err != nil || weight <= 0 {
				return nil, fmt.Errorf("loadgen: costs: %q: weight must be a whole number > 0", part)
			}
		}
		out = append(out, Cost{cost, weight})
	}
	if len(out) == 0 {
		return nil, errors.New("loadgen: costs: empty")
	}
	return out, nil
}

// Config describes a run. Zero fields take the defaults written on them.
type Config struct {
	// Target is TargetHTTP, TargetGRPC or TargetEnvoy; empty means HTTP.
	Target string
	// Addr is the server's address, host:port (for HTTP also a URL,
	// http(s)://host:port[/path], the API's paths going under path).
	// Required; an address no request could go to is an error of Run.
	Addr string
	// Concurrency is the number of concurrent callers; zero means 64.
	Concurrency int
	// Rate is the total requests per second in fixed-rate mode, spread
	// over the callers; zero means closed loop (each caller sends its next
	// request when the previous one is answered).
	Rate float64
	// Duration bounds the run; zero means 10s, at most MaxDuration.
	Duration time.Duration
	// Requests bounds the number of requests; zero means no bound but
	// Duration.
	Requests int64
	// Keys is the number of distinct keys; zero means 1000.
	Keys int
	// Zipf draws keys from a Zipf distribution of exponent ZipfS (key 0
	// the most frequent) instead of uniformly.
	Zipf bool
	// ZipfS is the Zipf exponent, above 1; zero means 1.1.
	ZipfS float64
	// Costs is the cost mix; nil means cost 1 always.
	Costs []Cost
	// KeyPrefix prefixes the key numbers; empty names the keys by their
	// numbers alone.
	KeyPrefix string
	// Resource is the resource of HTTP and gRPC checks; empty sends checks
	// that name none. With Batch, check i of a batch goes to
	// Resource + "/" + i.
	Resource string
	// Resources, when above 1, spreads the checks over that many
	// resources: a check of key k goes to Resource + "/" + (k mod
	// Resources), so that a policy of one rule per resource sees its
	// rules hit as the keys are drawn. Not with Batch.
	Resources int
	// Batch sends batches of this many checks of one key (HTTP and gRPC,
	// all-or-nothing); 0 or 1 sends single checks.
	Batch int
	// Domain and DescriptorKey shape Envoy requests: one descriptor
	// {DescriptorKey: key}; empty mean "sluice" and "client_id".
	Domain, DescriptorKey string
	// Conns is the number of gRPC connections the callers share; zero
	// means 2.
	Conns int
	// GRPCClient is the client of the gRPC and Envoy targets: ClientH2
	// (the default, a lean HTTP/2 client of the load generator's own),
	// ClientXNet (golang.org/x/net/http2's Transport) or ClientGRPCGo
	// (grpc-go's); the last two cost several times the CPU per call.
	GRPCClient string
	// TLS, when set, is the TLS configuration of the connections to the
	// server, whose address is then a host:port or, for HTTP, an https
	// URL. Nil connects over plain TCP, except to an https URL (which
	// trusts the system's roots).
	TLS *tls.Config
	// Timeout bounds each request; zero means 1s.
	Timeout time.Duration
	// ExpectLimit, when positive, is the cost the server should admit per
	// key per Window; the report then gives the overshoot.
	ExpectLimit int64
	// Window is the window of ExpectLimit, aligned on the Unix epoch as
	// fixed windows are; zero means the whole run is one window.
	Window time.Duration
	// Seed seeds the key and cost draws; zero means 1.
	Seed uint64
	// Progress, when not nil, is called every ProgressInterval while the
	// run goes on with its counts so far, from a goroutine of Run's own
	// (one call at a time), and once more when the run is over.
	Progress func(Progress)
	// ProgressInterval is the period of the Progress calls; zero means 1s.
	ProgressInterval time.Duration
	// AllAtOnce sends one request per caller, Concurrency in all, released
	// together once every caller is ready: a burst. Rate, Duration and
	// Requests do not apply. With one key and ExpectLimit, the report
	// says how many of the burst the server admitted against the limit.
	AllAtOnce bool
}

func (c *Config) defaults() error {
	if c.Target == "" {
		c.Target = TargetHTTP
	}
	switch c.Target {
	case TargetHTTP, TargetGRPC, TargetEnvoy:
	default:
		return fmt.Errorf("loadgen: target %q: want http, grpc or envoy", c.Target)
	}
	if c.Addr == "" {
		return errors.New("loadgen: an address is required")
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Concurrency < 0 || c.Concurrency > MaxConcurrency {
		return fmt.Errorf("loadgen: concurrency %d: want 1 to %d", c.Concurrency, MaxConcurrency)
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		return fmt.Errorf("loadgen: rate %v: want >= 0", c.Rate)
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Duration < 0 || c.Duration > MaxDuration {
		return fmt.Errorf("loadgen: duration %s: want more than 0, at most %s", c.Duration, MaxDuration)
	}
	if c.Requests < 0 {
		return fmt.Errorf("loadgen: requests %d: want >= 0", c.Requests)
	}
	if c.Keys == 0 {
		c.Keys = 1000
	}
	if c.Keys < 0 || c.Keys > MaxKeys {
		return fmt.Errorf("loadgen: keys %d: want 1 to %d", c.Keys, MaxKeys)
	}
	if c.ZipfS == 0 {
		c.ZipfS = 1.1
	}
	if c.Zipf && !(c.ZipfS > 1) {
		return fmt.Errorf("loadgen: zipf exponent %v: want > 1", c.ZipfS)
	}
	if len(c.Costs) == 0 {
		c.Costs = []Cost{{1, 1}}
	}
	var weights int64
	for _, k := range c.Costs {
		if k.Cost < 0 || k.Weight <= 0 {
			return fmt.Errorf("loadgen: cost %d weight %d: want cost >= 0 and weight > 0", k.Cost, k.Weight)
		}
		if c.Target == TargetEnvoy && k.Cost > math.MaxUint32 {
			return fmt.Errorf("loadgen: cost %d: Envoy's hits_addend holds at most %d", k.Cost, uint32(math.MaxUint32))
		}
		if weights += k.Weight; weights < 0 {
			return fmt.Errorf("loadgen: costs: the weights add up to more than %d", int64(math.MaxInt64))
		}
	}
	if c.Batch < 0 || c.Batch > MaxBatch {
		return fmt.Errorf("loadgen: batch %d: want 0 to %d", c.Batch, MaxBatch)
	}
	if c.Batch > 1 && c.Target == TargetEnvoy {
		return errors.New("loadgen: batches are for the http and grpc targets")
	}
	if c.Resources < 0 || c.Resources > MaxKeys {
		return fmt.Errorf("loadgen: resources %d: want 0 to %d", c.Resources, MaxKeys)
	}
	if c.Resources > 1 && (c.Batch > 1 || c.Target == TargetEnvoy) {
		return errors.New("loadgen: resources are for single checks of the http and grpc targets")
	}
	if c.Domain == "" {
		c.Domain = "sluice"
	}
	if c.DescriptorKey == "" {
		c.DescriptorKey = "client_id"
	}
	if c.Conns == 0 {
		c.Conns = 2
	}
	switch c.GRPCClient {
	case "":
		c.GRPCClient = ClientH2
	case ClientH2, ClientGRPCGo, ClientXNet:
	default:
		return fmt.Errorf("loadgen: grpc client %q: want h2, x-net or grpc-go", c.GRPCClient)
	}
	switch {
	case c.Target == TargetHTTP:
		u, err := url.Parse(httpBase(c.Addr, c.TLS != nil))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("loadgen: address %q: want host:port or http(s)://host:port[/path]", c.Addr)
		}
		if u.Scheme == "http" && c.TLS != nil {
			return fmt.Errorf("loadgen: address %q: an http URL with TLS settings; want https://", c.Addr)
		}
	case c.GRPCClient == ClientH2 || c.GRPCClient == ClientXNet:
		// grpc-go takes its own target syntax (dns:///host:port, ...);
		// the lean client dials host:port.
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			return fmt.Errorf("loadgen: address %q: want host:port: %v", c.Addr, err)
		}
	}
	if c.Conns < 0 || c.Conns > 64 {
		return fmt.Errorf("loadgen: conns %d: want 1 to 64", c.Conns)
	}
	if c.Timeout == 0 {
		c.Timeout = time.Second
	}
	if c.Timeout < 0 {
		return fmt.Errorf("loadgen: timeout %s: want more than 0", c.Timeout)
	}
	if c.Window < 0 || c.ExpectLimit < 0 {
		return errors.New("loadgen: expect-limit and window must not be negative")
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	return nil
}

// ErrInvalidConfig is the error (tested with errors.Is) of Run for a
// Config it refuses: before connecting to anything, or, for the lean gRPC
// client, once connected, when the callers per connection are more than
// the server allows at once. Run's other errors are those of connecting
// to the server.
var ErrInvalidConfig = errors.New("loadgen: invalid configuration")

// configError is a problem of a Config; its message says which.
type configError struct{ err error }

func (e configError) Error() string        { return e.err.Error() }
func (e configError) Unwrap() error        { return e.err }
func (e configError) Is(target error) bool { return target == ErrInvalidConfig }

// Run performs a run and returns its report. It stops sending at
// Duration or after Requests requests, whichever comes first, and returns
// once the requests in flight are answered or have failed (each within
// Timeout), so that they are counted as the server decided them. When ctx
// ends it returns at once, the requests in flight abandoned uncounted.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, configError{err}
	}
	r := newRun(cfg, nil)
	defer reportProgress(cfg, []*run{r})()
	workers, start, elapsed, err := r.execute(ctx)
	if err != nil {
		return nil, err
	}
	return r.report(workers, elapsed, start), nil
}

// newRun prepares a run of cfg (with its defaults), counting the cost
// admitted per key in shared's counters when it is not nil (a run over
// several regions) and in its own otherwise.
func newRun(cfg Config, shared *run) *run {
	r := &run{cfg: cfg}
	if shared != nil {
		r.perKey, r.touched = shared.perKey, shared.touched
	} else {
		r.perKey, r.touched = make([]atomic.Int64, cfg.Keys), make([]atomic.Bool, cfg.Keys)
	}
	r.keyNames = make([]string, cfg.Keys)
	for i := range r.keyNames {
		r.keyNames[i] = cfg.KeyPrefix + strconv.Itoa(i)
	}
	r.resources = []string{cfg.Resource}
	if cfg.Resources > 1 {
		r.resources = make([]string, cfg.Resources)
		for i := range r.resources {
			r.resources[i] = cfg.Resource + "/" + strconv.Itoa(i)
		}
	}
	for _, c := range cfg.Costs {
		r.costTotal += c.Weight
	}
	r.workers = make([]*worker, cfg.Concurrency)
	for i := range r.workers {
		w := &worker{rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)))}
		if cfg.Zipf {
			w.zipf = rand.NewZipf(w.rng, cfg.ZipfS, 1, uint64(cfg.Keys-1))
		}
		r.workers[i] = w
	}
	return r
}

// execute sends the run's requests and returns its workers, when it
// started and how long it took.
func (r *run) execute(ctx context.Context) ([]*worker, time.Time, time.Duration, error) {
	cfg := r.cfg
	cl, closeFn, err := newCaller(&r.cfg, r)
	if err != nil {
		return nil, time.Time{}, 0, err
	}
	defer closeFn()

	// Once the run's time is up no request is sent, but those in flight
	// are answered (each within Timeout) and counted: the server has
	// decided them, and the admitted cost must be what it admitted. Only
	// the end of ctx abandons them.
	sending, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	workers := r.workers
	start := time.Now()
	if cfg.AllAtOnce {
		start = r.burst(ctx, cl, workers)
	} else if h, ok := cl.(*h2Caller); ok && cfg.Rate == 0 {
		h.loop(ctx, sending, workers)
	} else {
		var wg sync.WaitGroup
		for i, w := range workers {
			wg.Go(func() { r.work(ctx, sending, cl, w, i, start) })
		}
		wg.Wait()
	}
	return workers, start, time.Since(start), nil
}
