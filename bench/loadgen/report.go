// The report of a run: counts, latency histogram, overshoot, and its text.

package loadgen

import (
	"fmt"
	"io"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

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
		rep.Allowed += w.allowed.Load()
		rep.Denied += w.denied.Load()
		rep.Errors += w.errs.Load()
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
