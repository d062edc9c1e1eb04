// A run over several regions at once: one load per region's server, on the
// same keys, so that what all of them admitted is compared with a global
// limit.

package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Region is one region's server in RunRegions.
type Region struct {
	// Addr is the server's address, as Config.Addr.
	Addr string
	// Weight is the region's part of the demand: Weight over the sum of
	// the regions' weights of Config.Concurrency (one caller at least)
	// and of Config.Rate.
	Weight int
}

// ParseRegions parses addresses and weights, "a,b,c" and "60,30,10"; an
// empty weights string weighs the regions alike.
func ParseRegions(addrs, weights string) ([]Region, error) {
	var out []Region
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a == "" {
			return nil, errors.New("loadgen: regions: an empty address")
		}
		out = append(out, Region{Addr: a, Weight: 1})
	}
	if weights == "" {
		return out, nil
	}
	ws := strings.Split(weights, ",")
	if len(ws) != len(out) {
		return nil, fmt.Errorf("loadgen: regions: %d weights for %d addresses", len(ws), len(out))
	}
	for i, w := range ws {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("loadgen: regions: weight %q: want a whole number > 0", w)
		}
		out[i].Weight = n
	}
	return out, nil
}

// RunRegions runs one load per region at once, on the same keys, each
// region taking its weight's part of cfg's callers and rate (cfg.Addr is
// ignored). The first report is the whole run: its overshoot compares the
// cost admitted in all regions together with ExpectLimit, a global limit.
// Then one report per region, without an overshoot.
func RunRegions(ctx context.Context, cfg Config, regions []Region) (*Report, []*Report, error) {
	if len(regions) == 0 {
		return nil, nil, configError{errors.New("loadgen: regions: none")}
	}
	total := 0
	for _, rg := range regions {
		if rg.Weight <= 0 {
			return nil, nil, configError{fmt.Errorf("loadgen: regions: weight %d of %s: want more than 0", rg.Weight, rg.Addr)}
		}
		total += rg.Weight
	}
	whole := cfg
	whole.Addr = regions[0].Addr
	if err := whole.defaults(); err != nil {
		return nil, nil, configError{err}
	}
	runs := make([]*run, len(regions))
	var shared *run
	for i, rg := range regions {
		c := whole
		c.Addr = rg.Addr
		c.Concurrency = max(whole.Concurrency*rg.Weight/total, 1)
		c.Rate = whole.Rate * float64(rg.Weight) / float64(total)
		c.Seed = whole.Seed + uint64(i)
		if err := c.defaults(); err != nil {
			return nil, nil, configError{fmt.Errorf("region %s: %w", rg.Addr, err)}
		}
		runs[i] = newRun(c, shared)
		if shared == nil {
			shared = runs[i]
		}
	}
	type result struct {
		workers []*worker
		start   time.Time
		elapsed time.Duration
		err     error
	}
	defer reportProgress(whole, runs)()
	results := make([]result, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() {
			w, s, e, err := r.execute(ctx)
			results[i] = result{w, s, e, err}
		})
	}
	wg.Wait()
	var all []*worker
	var start, end time.Time
	each := make([]*Report, len(runs))
	addrs := make([]string, len(regions))
	for i, res := range results {
		if res.err != nil {
			return nil, nil, fmt.Errorf("region %s: %w", regions[i].Addr, res.err)
		}
		all = append(all, res.workers...)
		if start.IsZero() || res.start.Before(start) {
			start = res.start
		}
		if e := res.start.Add(res.elapsed); e.After(end) {
			end = e
		}
		rep := runs[i].report(res.workers, res.elapsed, res.start)
		rep.Overshoot = nil // the keys' counts are the whole run's
		each[i] = rep
		addrs[i] = regions[i].Addr
	}
	whole.Addr = strings.Join(addrs, ",")
	sum := &run{cfg: whole, perKey: shared.perKey, touched: shared.touched}
	return sum.report(all, end.Sub(start), start), each, nil
}
