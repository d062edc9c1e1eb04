// Package loadgen is Sluice's load generator, behind `sluice load`. It
// drives a running server through its HTTP JSON API, its gRPC API or
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
// package's own (see h2Conn) unless Config.GRPCClient asks for grpc-go's:
// on a small machine a load generator that costs as much CPU per call as
// the server it measures halves what it can show. The lean client does not
// reconnect: when the server closes the connection, the calls on it fail
// and are counted as errors; in a closed loop their callers then stop, and
// the run ends when every caller has. Nor does it send a request in parts
// as a stream's flow-control window opens: a request larger than the
// server's initial stream window, or than its connection window with
// nothing in flight (64 KiB unless the server grants more; Sluice's gRPC
// server grants 1 MiB), fails with an error that says so.
// Requests larger than the server's largest frame go out in several DATA
// frames.
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
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
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
	// (the default, a lean HTTP/2 client of the load generator's own) or
	// ClientGRPCGo (grpc-go's, which costs several times the CPU per call).
	GRPCClient string
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
	case ClientH2, ClientGRPCGo:
	default:
		return fmt.Errorf("loadgen: grpc client %q: want h2 or grpc-go", c.GRPCClient)
	}
	switch {
	case c.Target == TargetHTTP:
		u, err := url.Parse(httpBase(c.Addr))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("loadgen: address %q: want host:port or http(s)://host:port[/path]", c.Addr)
		}
	case c.GRPCClient == ClientH2:
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

// Report is the outcome of a run.
type Report struct {
	// Target, Addr, Concurrency, Rate (0: closed loop), Batch and Keys
	// repeat the run's configuration.
	Target      string  `json:"target"`
	Addr        string  `json:"addr"`
	Concurrency int     `json:"concurrency"`
	Rate        float64 `json:"rate,omitempty"`
	Batch       int     `json:"batch,omitempty"`
	Keys        int     `json:"keys"`
	// AllAtOnce repeats Config.AllAtOnce: the run was one burst of
	// Concurrency requests.
	AllAtOnce bool `json:"all_at_once,omitempty"`
	// Distribution is "uniform" or "zipf(s)".
	Distribution string `json:"distribution"`
	// Elapsed is the measured time, in seconds: Duration (or less, with
	// Requests) and the wait for the requests in flight at its end.
	Elapsed float64 `json:"elapsed_seconds"`
	// Requests counts the requests answered or failed; Allowed, Denied and
	// Errors split them.
	Requests int64 `json:"requests"`
	Allowed  int64 `json:"allowed"`
	Denied   int64 `json:"denied"`
	Errors   int64 `json:"errors"`
	// Throughput is Requests / Elapsed; with batches, Checks counts the
	// checks (Requests × Batch) and CheckThroughput their rate.
	Throughput      float64 `json:"throughput"`
	Checks          int64   `json:"checks"`
	CheckThroughput float64 `json:"check_throughput"`
	// Latency holds the latency figures of the answered requests (allowed
	// or denied), in milliseconds; failed requests are left out. It is
	// nil, and left out of the JSON, when no request was answered.
	Latency *Latency `json:"latency_ms,omitempty"`
	// ErrorSamples holds up to five distinct error messages.
	ErrorSamples []string `json:"error_samples,omitempty"`
	// AdmittedCost is the total cost admitted.
	AdmittedCost int64 `json:"admitted_cost"`
	// Overshoot is reported when ExpectLimit is set.
	Overshoot *Overshoot `json:"overshoot,omitempty"`
}

// Latency holds latency figures in milliseconds: the 50th, 90th, 99th
// and 99.9th percentiles, the maximum and the mean, each within 3% (the
// histogram's resolution).
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// Overshoot compares the cost admitted per key with ExpectLimit per
// window: each key may be admitted ExpectLimit times the number of windows
// the run touched.
type Overshoot struct {
	// ExpectLimit and Window (seconds) repeat the configuration; Windows
	// is the number of windows the run touched.
	ExpectLimit int64   `json:"expect_limit"`
	Window      float64 `json:"window_seconds"`
	Windows     int64   `json:"windows"`
	// KeysOver counts the keys admitted more than allowed; Max is the
	// largest excess of one key, Total the sum of the excesses, and
	// Ratio Total over the cost the server could rightly admit to the
	// keys that received traffic.
	KeysOver int64   `json:"keys_over"`
	Max      int64   `json:"max"`
	Total    int64   `json:"total"`
	Ratio    float64 `json:"ratio"`
}

// histogram is a log-linear latency histogram in nanoseconds: exact below
// 64 ns, then 32 buckets per power of two (at most 3% error).
type histogram struct {
	counts [64 + 58*32]int64
	max    int64
	sum    int64
	n      int64
}

func bucketOf(v int64) int {
	if v < 64 {
		return int(max(v, 0))
	}
	k := bits.Len64(uint64(v)) - 1 // v in [2^k, 2^(k+1))
	top := v >> (k - 5)            // 32..63
	return 64 + (k-6)*32 + int(top-32)
}

// valueOf returns the middle of bucket i.
func valueOf(i int) int64 {
	if i < 64 {
		return int64(i)
	}
	k := (i-64)/32 + 6
	top := int64((i-64)%32 + 32)
	lo := top << (k - 5)
	return lo + (int64(1)<<(k-5))/2
}

func (h *histogram) record(d time.Duration) {
	v := int64(d)
	h.counts[bucketOf(v)]++
	h.n++
	h.sum += v
	h.max = max(h.max, v)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// quantile returns the q-quantile in nanoseconds.
func (h *histogram) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(valueOf(i), h.max)
		}
	}
	return h.max
}

// caller is what a worker sends requests through.
type caller interface {
	// call sends one request for key with cost; allowed is the verdict.
	call(ctx context.Context, w *worker, key int, cost int64) (allowed bool, err error)
}

// worker is one concurrent caller; its fields are its own.
type worker struct {
	rng      *rand.Rand
	zipf     *rand.Zipf
	hist     histogram
	allowed  int64
	denied   int64
	errs     int64
	errMsgs  []string
	admitted int64
	buf      []byte
	// Reused request messages (a unary call has marshalled its request
	// when it returns).
	envoyReq   *rlsv3.RateLimitRequest
	envoyEntry *ratelimitv3.RateLimitDescriptor_Entry
	grpcReq    *sluicev1.CheckRequest
	batchReq   *sluicev1.BatchCheckRequest
	h2         *h2Call
}

// run holds what the workers share.
type run struct {
	cfg       Config
	costTotal int64
	issued    atomic.Int64
	perKey    []atomic.Int64 // cost admitted per key
	touched   []atomic.Bool  // keys that received a request
	keyNames  []string
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
	r := &run{cfg: cfg, perKey: make([]atomic.Int64, cfg.Keys), touched: make([]atomic.Bool, cfg.Keys)}
	r.keyNames = make([]string, cfg.Keys)
	for i := range r.keyNames {
		r.keyNames[i] = cfg.KeyPrefix + strconv.Itoa(i)
	}
	for _, c := range cfg.Costs {
		r.costTotal += c.Weight
	}
	cl, closeFn, err := newCaller(&r.cfg, r)
	if err != nil {
		return nil, err
	}
	defer closeFn()

	// Once the run's time is up no request is sent, but those in flight
	// are answered (each within Timeout) and counted: the server has
	// decided them, and the admitted cost must be what it admitted. Only
	// the end of ctx abandons them.
	sending, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	workers := make([]*worker, cfg.Concurrency)
	for i := range workers {
		w := &worker{rng: rand.New(rand.NewPCG(cfg.Seed, uint64(i)))}
		if cfg.Zipf {
			w.zipf = rand.NewZipf(w.rng, cfg.ZipfS, 1, uint64(cfg.Keys-1))
		}
		workers[i] = w
	}
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
	elapsed := time.Since(start)
	return r.report(workers, elapsed, start), nil
}

// burst sends one request from each worker, all released together once
// every worker's goroutine runs, and returns the instant of the release.
func (r *run) burst(ctx context.Context, cl caller, workers []*worker) time.Time {
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	for _, w := range workers {
		ready.Add(1)
		done.Go(func() {
			key, cost := r.pickKey(w), r.pickCost(w)
			ready.Done()
			<-release
			due := time.Now()
			rctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
			allowed, err := cl.call(rctx, w, key, cost)
			cancel()
			if err != nil && ctx.Err() != nil {
				return // the run was abandoned during the call
			}
			r.record(w, key, cost, due, allowed, err)
		})
	}
	ready.Wait()
	start := time.Now()
	close(release)
	done.Wait()
	return start
}

// work runs one caller until sending ends or the request budget is
// spent; its last request is answered, unless ctx ends.
func (r *run) work(ctx, sending context.Context, cl caller, w *worker, idx int, start time.Time) {
	var interval time.Duration
	next := start
	if r.cfg.Rate > 0 {
		// In float nanoseconds, bounded before the conversion: a rate so
		// low that the interval overflows time.Duration sends no second
		// request in the longest run, and one so high that it rounds
		// to zero still keeps a schedule.
		ns := float64(time.Second) * float64(r.cfg.Concurrency) / r.cfg.Rate
		interval = time.Duration(min(max(ns, 1), float64(2*MaxDuration)))
		// Spread the callers' first requests over one interval.
		next = start.Add(time.Duration(min(ns*float64(idx)/float64(r.cfg.Concurrency), float64(2*MaxDuration))))
	}
	for sending.Err() == nil {
		if r.cfg.Requests > 0 && r.issued.Add(1) > r.cfg.Requests {
			return
		}
		due := time.Now()
		if interval > 0 {
			if wait := time.Until(next); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-sending.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			due = next
			next = next.Add(interval)
		}
		key := r.pickKey(w)
		cost := r.pickCost(w)
		rctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		allowed, err := cl.call(rctx, w, key, cost)
		cancel()
		if err != nil && ctx.Err() != nil {
			return // the run was abandoned during the call: not an error of the server
		}
		r.record(w, key, cost, due, allowed, err)
	}
}

// record counts the answer to one request of w for key with cost, sent
// at due, or its failure (err); only an answer's latency is recorded.
func (r *run) record(w *worker, key int, cost int64, due time.Time, allowed bool, err error) {
	r.touched[key].Store(true)
	if err != nil {
		w.errs++
		if len(w.errMsgs) < 5 {
			w.errMsgs = append(w.errMsgs, err.Error())
		}
		return
	}
	w.hist.record(time.Since(due))
	switch {
	case allowed:
		w.allowed++
		if cost == 0 && r.cfg.Target == TargetEnvoy {
			cost = 1 // Envoy's hits_addend 0 means 1
		}
		units := cost * int64(max(r.cfg.Batch, 1))
		w.admitted += units
		r.perKey[key].Add(units)
	default:
		w.denied++
	}
}

func (r *run) pickKey(w *worker) int {
	if w.zipf != nil {
		return int(w.zipf.Uint64())
	}
	return w.rng.IntN(r.cfg.Keys)
}

func (r *run) pickCost(w *worker) int64 {
	if len(r.cfg.Costs) == 1 {
		return r.cfg.Costs[0].Cost
	}
	n := w.rng.Int64N(r.costTotal)
	for _, c := range r.cfg.Costs {
		if n < c.Weight {
			return c.Cost
		}
		n -= c.Weight
	}
	return r.cfg.Costs[len(r.cfg.Costs)-1].Cost
}

func (r *run) report(workers []*worker, elapsed time.Duration, start time.Time) *Report {
	cfg := r.cfg
	rep := &Report{Target: cfg.Target, Addr: cfg.Addr, Concurrency: cfg.Concurrency, Rate: cfg.Rate,
		Keys: cfg.Keys, Distribution: "uniform", Elapsed: elapsed.Seconds(), AllAtOnce: cfg.AllAtOnce}
	if cfg.Batch > 1 {
		rep.Batch = cfg.Batch
	}
	if cfg.Zipf {
		rep.Distribution = "zipf(" + strconv.FormatFloat(cfg.ZipfS, 'g', -1, 64) + ")"
	}
	var h histogram
	seen := map[string]bool{}
	for _, w := range workers {
		h.merge(&w.hist)
		rep.Allowed += w.allowed
		rep.Denied += w.denied
		rep.Errors += w.errs
		rep.AdmittedCost += w.admitted
		for _, m := range w.errMsgs {
			if !seen[m] && len(rep.ErrorSamples) < 5 {
				seen[m] = true
				rep.ErrorSamples = append(rep.ErrorSamples, m)
			}
		}
	}
	rep.Requests = rep.Allowed + rep.Denied + rep.Errors
	rep.Checks = rep.Requests * int64(max(cfg.Batch, 1))
	if s := elapsed.Seconds(); s > 0 {
		rep.Throughput = float64(rep.Requests) / s
		rep.CheckThroughput = float64(rep.Checks) / s
	}
	if h.n > 0 {
		ms := func(ns int64) float64 { return float64(ns) / 1e6 }
		rep.Latency = &Latency{P50: ms(h.quantile(0.5)), P90: ms(h.quantile(0.9)), P99: ms(h.quantile(0.99)),
			P999: ms(h.quantile(0.999)), Max: ms(h.max), Mean: ms(h.sum / h.n)}
	}
	if cfg.ExpectLimit > 0 {
		o := &Overshoot{ExpectLimit: cfg.ExpectLimit, Windows: 1, Window: elapsed.Seconds()}
		if cfg.Window > 0 {
			end := start.Add(elapsed)
			o.Window = cfg.Window.Seconds()
			o.Windows = end.UnixNano()/int64(cfg.Window) - start.UnixNano()/int64(cfg.Window) + 1
		}
		allowedPerKey := cfg.ExpectLimit * o.Windows
		var rightful int64
		for i := range r.perKey {
			if !r.touched[i].Load() {
				continue
			}
			got := r.perKey[i].Load()
			rightful += min(got, allowedPerKey)
			if ex := got - allowedPerKey; ex > 0 {
				o.KeysOver++
				o.Total += ex
				o.Max = max(o.Max, ex)
			}
		}
		if rightful > 0 {
			o.Ratio = float64(o.Total) / float64(rightful)
		}
		rep.Overshoot = o
	}
	return rep
}

// Text writes rep for people.
func (rep *Report) Text(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "target      %s %s, %d callers", rep.Target, rep.Addr, rep.Concurrency)
	if rep.Rate > 0 {
		fmt.Fprintf(&b, ", fixed rate %.0f/s", rep.Rate)
	}
	if rep.Batch > 1 {
		fmt.Fprintf(&b, ", batches of %d", rep.Batch)
	}
	if rep.AllAtOnce {
		fmt.Fprintf(&b, ", all at once (one request each)")
	}
	fmt.Fprintf(&b, ", %d keys (%s)\n", rep.Keys, rep.Distribution)
	fmt.Fprintf(&b, "elapsed     %.2fs\n", rep.Elapsed)
	fmt.Fprintf(&b, "requests    %d (%.0f/s)", rep.Requests, rep.Throughput)
	if rep.Batch > 1 {
		fmt.Fprintf(&b, ", checks %d (%.0f/s)", rep.Checks, rep.CheckThroughput)
	}
	fmt.Fprintf(&b, "\nallowed     %d\ndenied      %d\nerrors      %d\n", rep.Allowed, rep.Denied, rep.Errors)
	for _, m := range rep.ErrorSamples {
		fmt.Fprintf(&b, "  error: %s\n", m)
	}
	if l := rep.Latency; l != nil {
		fmt.Fprintf(&b, "latency ms  p50 %.3f  p90 %.3f  p99 %.3f  p999 %.3f  max %.3f  mean %.3f", l.P50, l.P90, l.P99, l.P999, l.Max, l.Mean)
		if rep.Errors > 0 {
			b.WriteString(" (answered requests, errors left out)")
		}
		b.WriteByte('\n')
	} else {
		b.WriteString("latency ms  none: no request answered\n")
	}
	fmt.Fprintf(&b, "admitted    %d units of cost\n", rep.AdmittedCost)
	if o := rep.Overshoot; o != nil && rep.AllAtOnce && rep.Keys == 1 {
		fmt.Fprintf(&b, "burst       %d of %d requests admitted (cost %d) against a limit of %d per %.3gs window (%d windows)\n",
			rep.Allowed, rep.Requests, rep.AdmittedCost, o.ExpectLimit, o.Window, o.Windows)
	}
	if o := rep.Overshoot; o != nil {
		fmt.Fprintf(&b, "overshoot   limit %d per key per %.3gs window (%d windows): %d keys over, max %d, total %d (%.4f%%)\n",
			o.ExpectLimit, o.Window, o.Windows, o.KeysOver, o.Max, o.Total, 100*o.Ratio)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// newCaller returns the caller of cfg.Target and the function that
// releases it.
func newCaller(cfg *Config, r *run) (caller, func(), error) {
	switch cfg.Target {
	case TargetHTTP:
		base := httpBase(cfg.Addr)
		tr := &http.Transport{
			MaxIdleConns:        cfg.Concurrency,
			MaxIdleConnsPerHost: cfg.Concurrency,
			MaxConnsPerHost:     cfg.Concurrency,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		}
		path := "/api/v1/check"
		if cfg.Batch > 1 {
			path = "/api/v1/batch-check"
		}
		return &httpCaller{r: r, url: strings.TrimSuffix(base, "/") + path, client: &http.Client{Transport: tr}},
			tr.CloseIdleConnections, nil
	case TargetGRPC, TargetEnvoy:
		if cfg.GRPCClient == ClientH2 {
			return newH2Caller(cfg, r)
		}
		conns := make([]*grpc.ClientConn, cfg.Conns)
		closeAll := func() {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}
		for i := range conns {
			c, err := grpc.NewClient(cfg.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("loadgen: %w", err)
			}
			conns[i] = c
		}
		if cfg.Target == TargetEnvoy {
			g := &envoyCaller{r: r}
			for _, c := range conns {
				g.clients = append(g.clients, rlsv3.NewRateLimitServiceClient(c))
			}
			return g, closeAll, nil
		}
		g := &grpcCaller{r: r}
		for _, c := range conns {
			g.clients = append(g.clients, sluicev1.NewRateLimiterClient(c))
		}
		return g, closeAll, nil
	}
	return nil, nil, fmt.Errorf("loadgen: unknown target %q", cfg.Target)
}

// httpBase returns the base URL of the HTTP API at addr, host:port or a
// URL.
func httpBase(addr string) string {
	if !strings.Contains(addr, "://") {
		return "http://" + addr
	}
	return addr
}

type httpCaller struct {
	r      *run
	url    string
	client *http.Client
}

func (h *httpCaller) call(ctx context.Context, w *worker, key int, cost int64) (bool, error) {
	cfg := &h.r.cfg
	b := w.buf[:0]
	b = append(b, `{"client_id":`...)
	b = strconv.AppendQuote(b, h.r.keyNames[key])
	if cfg.Batch > 1 {
		b = append(b, `,"mode":"all_or_nothing","checks":[`...)
		for i := range cfg.Batch {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"resource":`...)
			b = strconv.AppendQuote(b, cfg.Resource+"/"+strconv.Itoa(i))
			b = append(b, `,"cost":`...)
			b = strconv.AppendInt(b, cost, 10)
			b = append(b, '}')
		}
		b = append(b, "]}"...)
	} else {
		b = append(b, `,"resource":`...)
		b = strconv.AppendQuote(b, cfg.Resource)
		b = append(b, `,"cost":`...)
		b = strconv.AppendInt(b, cost, 10)
		b = append(b, '}')
	}
	w.buf = b
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(b))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return false, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusTooManyRequests:
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}
	err = httpError(resp)
	resp.Body.Close()
	return false, err
}

// httpError returns the error of an answer that is neither a verdict:
// its status and the reason the body gives (Sluice's error and
// error_description, or the start of any other body).
func httpError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	io.Copy(io.Discard, resp.Body)
	var e struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		if e.Description == "" {
			return fmt.Errorf("HTTP %d %s", resp.StatusCode, e.Error)
		}
		return fmt.Errorf("HTTP %d %s: %s", resp.StatusCode, e.Error, e.Description)
	}
	if b := strings.TrimSpace(string(body[:min(len(body), 200)])); b != "" {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.ToValidUTF8(b, "?"))
	}
	return fmt.Errorf("HTTP %d", resp.StatusCode)
}

type grpcCaller struct {
	r       *run
	clients []sluicev1.RateLimiterClient
	next    atomic.Uint32
}

func (g *grpcCaller) call(ctx context.Context, w *worker, key int, cost int64) (bool, error) {
	cfg := &g.r.cfg
	c := g.clients[int(g.next.Add(1))%len(g.clients)]
	if cfg.Batch > 1 {
		resp, err := c.BatchCheck(ctx, w.batchRequest(cfg, g.r.keyNames[key], cost))
		if err != nil {
			return false, err
		}
		return resp.GetAllowed(), nil
	}
	resp, err := c.CheckRateLimit(ctx, w.checkRequest(cfg, g.r.keyNames[key], cost))
	if err != nil {
		return false, err
	}
	return resp.GetAllowed(), nil
}

// checkRequest returns w's CheckRequest, set for key and cost. A unary
// call has marshalled its request when it returns, so one message serves
// all of w's calls.
func (w *worker) checkRequest(cfg *Config, key string, cost int64) *sluicev1.CheckRequest {
	if w.grpcReq == nil {
		w.grpcReq = &sluicev1.CheckRequest{Resource: cfg.Resource, Cost: new(int64)}
	}
	w.grpcReq.ClientId = key
	*w.grpcReq.Cost = cost
	return w.grpcReq
}

// batchRequest returns w's BatchCheckRequest of cfg.Batch checks, set for
// key and cost.
func (w *worker) batchRequest(cfg *Config, key string, cost int64) *sluicev1.BatchCheckRequest {
	if w.batchReq == nil {
		checks := make([]*sluicev1.CheckRequest, cfg.Batch)
		for i := range checks {
			checks[i] = &sluicev1.CheckRequest{Resource: cfg.Resource + "/" + strconv.Itoa(i), Cost: new(int64)}
		}
		w.batchReq = &sluicev1.BatchCheckRequest{Mode: sluicev1.BatchMode_BATCH_MODE_ALL_OR_NOTHING, Checks: checks}
	}
	w.batchReq.ClientId = key
	for _, c := range w.batchReq.Checks {
		*c.Cost = cost
	}
	return w.batchReq
}

// envoyRequest returns w's RateLimitRequest: one descriptor
// {cfg.DescriptorKey: key}, hits_addend cost.
func (w *worker) envoyRequest(cfg *Config, key string, cost int64) *rlsv3.RateLimitRequest {
	if w.envoyReq == nil {
		w.envoyEntry = &ratelimitv3.RateLimitDescriptor_Entry{Key: cfg.DescriptorKey}
		w.envoyReq = &rlsv3.RateLimitRequest{Domain: cfg.Domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{w.envoyEntry}}}}
	}
	w.envoyEntry.Value = key
	w.envoyReq.HitsAddend = uint32(cost)
	return w.envoyReq
}

type envoyCaller struct {
	r       *run
	clients []rlsv3.RateLimitServiceClient
	next    atomic.Uint32
}

func (g *envoyCaller) call(ctx context.Context, w *worker, key int, cost int64) (bool, error) {
	cfg := &g.r.cfg
	c := g.clients[int(g.next.Add(1))%len(g.clients)]
	resp, err := c.ShouldRateLimit(ctx, w.envoyRequest(cfg, g.r.keyNames[key], cost))
	if err != nil {
		return false, err
	}
	return envoyVerdict(resp.GetOverallCode())
}

// envoyVerdict returns whether Envoy's overall code admits the request:
// OK does, OVER_LIMIT does not, anything else is an error.
func envoyVerdict(code rlsv3.RateLimitResponse_Code) (bool, error) {
	switch code {
	case rlsv3.RateLimitResponse_OK:
		return true, nil
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return false, nil
	}
	return false, fmt.Errorf("envoy: overall code %s", code)
}
