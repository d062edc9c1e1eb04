// The workers and what they share: the loops, the keys and costs, the records.

package loadgen

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// caller is what a worker sends requests through.
type caller interface {
	// call sends one request for key with cost; allowed is the verdict.
	call(ctx context.Context, w *worker, key int, cost int64) (allowed bool, err error)
}

// worker is one concurrent caller; its fields are its own.
type worker struct {
	rng  *rand.Rand
	zipf *rand.Zipf
	hist histogram
	// allowed, denied and errs are written by the worker alone and read
	// by the progress reports while it runs.
	allowed  atomic.Int64
	denied   atomic.Int64
	errs     atomic.Int64
	errMsgs  []string
	admitted int64
	buf      []byte
	resp     []byte // a reply, read whole (ClientXNet)
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
	resources []string // by key mod its length
	workers   []*worker
}

// resource returns the resource of a single check of key.
func (r *run) resource(key int) string { return r.resources[key%len(r.resources)] }

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
		w.errs.Add(1)
		if len(w.errMsgs) < 5 {
			w.errMsgs = append(w.errMsgs, err.Error())
		}
		return
	}
	w.hist.record(time.Since(due))
	switch {
	case allowed:
		w.allowed.Add(1)
		if cost == 0 && r.cfg.Target == TargetEnvoy {
			cost = 1 // Envoy's hits_addend 0 means 1
		}
		units := cost * int64(max(r.cfg.Batch, 1))
		w.admitted += units
		r.perKey[key].Add(units)
	default:
		w.denied.Add(1)
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
