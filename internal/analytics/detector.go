package analytics

import (
	"cmp"
	"math"
	"slices"
)

// The anomaly detector runs in the Recorder's aggregator, never on the
// check path: it reads the rollups the aggregator publishes, and closes a
// key's minute once the clock is two seconds past its end (the events of
// the minute still queued have been folded by then) or once a rollup of a
// later minute of the key arrives.
//
// Its keys are each client on a resource in a region, and each resource
// in a region with every client together (an empty client), which sees a
// surge spread over many clients, new ones included (a resource's anomaly
// is left out when one of its clients' explains it: same kind and minute).
// For each key it keeps
// two exponentially
// weighted moving averages over the minutes it saw, with a weight of 2/61
// (the usual weight of a 60-minute average): requests per minute, and the
// share of them blocked. A minute without checks counts as zero requests
// and leaves the block rate's average as it was. A closed minute is an
// anomaly when the key has been tracked for Warmup minutes, the minute has
// at least MinRequests checks, and
//
//   - requests_spike: its requests are at least Factor times the average
//     (an average below 1 counts as 1), or
//   - block_rate_spike: its block rate is at least Factor times the
//     average rate and at least MinBlockRate.
//
// The minute is then added to the averages, anomaly or not, so a key that
// stays at its new level is flagged once, not every minute. A key idle for
// an hour is forgotten (its average is then below 14% of what it was); it
// is tracked again, with a new warm-up, when it returns. At most MaxKeys
// keys are tracked; the rollups of keys beyond them are left out and
// counted (Stats.AnomalyRowsUntracked), once per key they miss.

// DetectorConfig shapes the anomaly detector. The zero value uses the
// defaults.
type DetectorConfig struct {
	// Factor is how many times its average a minute's figure must reach;
	// zero means 5.
	Factor float64
	// MinRequests is the fewest checks of a minute that can be an
	// anomaly; zero means 100.
	MinRequests int64
	// MinBlockRate is the lowest block rate that can be an anomaly; zero
	// means 0.2.
	MinBlockRate float64
	// Warmup is how many minutes a key is tracked before its minutes can
	// be anomalies; zero means 10.
	Warmup int
	// MaxKeys bounds the keys tracked; zero means 10,000, negative turns
	// detection off.
	MaxKeys int
}

// ewmaWeight is the weight of a new minute in the averages: 2/(N+1) for
// an N = 60 minute average.
const ewmaWeight = 2.0 / 61

// forgetAfter is how long, in seconds, a key stays tracked without checks.
const forgetAfter = 3600

// closeGrace is how long, in seconds, past its end a minute stays open.
const closeGrace = 2

// detectorKey is what the detector tracks.
type detectorKey struct {
	client, resource, region string
}

// baseline is one key's averages and its open minute.
type baseline struct {
	open              bool
	minute            int64 // the open minute, or the last closed one
	requests, blocked int64 // of the open minute
	avgRequests       float64
	avgBlockRate      float64
	minutes           int // closed so far, gaps included
}

// detector finds anomalies in the rollups it is given. It is owned by the
// aggregator goroutine and not safe for concurrent use.
type detector struct {
	cfg       DetectorConfig
	keys      map[detectorKey]*baseline
	untracked int64
	found     []Anomaly
}

// newDetector returns a detector for cfg, nil when cfg turns it off.
func newDetector(cfg DetectorConfig) *detector {
	if cfg.MaxKeys < 0 {
		return nil
	}
	if cfg.Factor <= 0 {
		cfg.Factor = 5
	}
	if cfg.MinRequests <= 0 {
		cfg.MinRequests = 100
	}
	if cfg.MinBlockRate <= 0 {
		cfg.MinBlockRate = 0.2
	}
	if cfg.Warmup <= 0 {
		cfg.Warmup = 10
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = 10_000
	}
	return &detector{cfg: cfg, keys: map[detectorKey]*baseline{}}
}

// add counts rollups, in minute order (add sorts them), to their client's
// key and their resource's.
func (d *detector) add(rs []Rollup) {
	slices.SortFunc(rs, func(x, y Rollup) int { return cmp.Compare(x.Minute, y.Minute) })
	for i := range rs {
		r := &rs[i]
		d.addTo(detectorKey{r.Client, r.Resource, r.Region}, r)
		d.addTo(detectorKey{"", r.Resource, r.Region}, r)
	}
}

// addTo counts r to key k. A rollup of a minute already closed for k is
// left out.
func (d *detector) addTo(k detectorKey, r *Rollup) {
	b := d.keys[k]
	if b == nil {
		if len(d.keys) >= d.cfg.MaxKeys {
			d.untracked++
			return
		}
		b = &baseline{open: true, minute: r.Minute}
		d.keys[k] = b
	}
	switch {
	case r.Minute < b.minute || (r.Minute == b.minute && !b.open):
		return
	case r.Minute > b.minute:
		if b.open {
			d.close(k, b)
		}
		d.skip(b, r.Minute)
		b.open, b.minute = true, r.Minute
	}
	b.requests += r.Requests
	if r.Blocked {
		b.blocked += r.Requests
	}
}

// closeUpTo closes the open minutes that ended closeGrace seconds before
// now (Unix seconds), forgets the keys idle for forgetAfter, and returns
// the anomalies found since the last call.
func (d *detector) closeUpTo(now int64) []Anomaly {
	current := now - closeGrace
	current -= mod(current, 60) // minutes before it are over
	for k, b := range d.keys {
		if b.open && b.minute < current {
			d.close(k, b)
		}
		if !b.open && b.minute < now-forgetAfter {
			delete(d.keys, k)
		}
	}
	found := explained(d.found)
	d.found = nil
	return found
}

// explained returns found without the anomalies of a resource (every
// client together) that an anomaly of one of its clients, of the same
// kind and minute, explains: one client's surge is reported once, as
// the client's.
func explained(found []Anomaly) []Anomaly {
	type at struct {
		kind, resource, region string
		minute                 int64
	}
	byClient := map[at]bool{}
	for _, a := range found {
		if a.Client != "" {
			byClient[at{a.Kind, a.Resource, a.Region, a.Minute}] = true
		}
	}
	out := found[:0]
	for _, a := range found {
		if a.Client != "" || !byClient[at{a.Kind, a.Resource, a.Region, a.Minute}] {
			out = append(out, a)
		}
	}
	return out
}

// skip counts the minutes without checks between b's last minute and
// minute, as zero requests.
func (d *detector) skip(b *baseline, minute int64) {
	gap := (minute-b.minute)/60 - 1
	if gap <= 0 || b.minutes == 0 {
		return
	}
	b.avgRequests *= math.Pow(1-ewmaWeight, float64(gap))
	b.minutes += int(gap)
}

// close judges b's open minute, adds it to the averages and closes it.
func (d *detector) close(k detectorKey, b *baseline) {
	n := float64(b.requests)
	rate := 0.0
	if b.requests > 0 {
		rate = float64(b.blocked) / n
	}
	if b.minutes == 0 {
		b.avgRequests, b.avgBlockRate = n, rate
	} else {
		if b.minutes >= d.cfg.Warmup && b.requests >= d.cfg.MinRequests {
			if n >= d.cfg.Factor*max(b.avgRequests, 1) {
				d.found = append(d.found, Anomaly{Kind: AnomalyRequests, Client: k.client, Resource: k.resource,
					Region: k.region, Minute: b.minute, Observed: n, Baseline: b.avgRequests})
			}
			if rate >= max(d.cfg.Factor*b.avgBlockRate, d.cfg.MinBlockRate) {
				d.found = append(d.found, Anomaly{Kind: AnomalyBlockRate, Client: k.client, Resource: k.resource,
					Region: k.region, Minute: b.minute, Observed: rate, Baseline: b.avgBlockRate})
			}
		}
		b.avgRequests += ewmaWeight * (n - b.avgRequests)
		if b.requests > 0 {
			b.avgBlockRate += ewmaWeight * (rate - b.avgBlockRate)
		}
	}
	b.minutes++
	b.open, b.requests, b.blocked = false, 0, 0
}
