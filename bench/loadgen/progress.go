package loadgen

import (
	"sync"
	"time"
)

// Progress is a run's counts so far, as Config.Progress receives them.
type Progress struct {
	// Elapsed is the time since the run started.
	Elapsed time.Duration
	// Requests is Allowed + Denied + Errors: the requests answered or
	// failed so far (those in flight are not counted yet).
	Requests int64
	// Allowed and Denied count the answers, Errors the failures.
	Allowed, Denied, Errors int64
}

// reportProgress starts calling cfg.Progress every cfg.ProgressInterval
// with the counts of runs' workers and returns the function that stops it
// and waits for it, after a last call with the final counts. Without
// cfg.Progress it does nothing.
func reportProgress(cfg Config, runs []*run) (stop func()) {
	if cfg.Progress == nil {
		return func() {}
	}
	every := cfg.ProgressInterval
	if every <= 0 {
		every = time.Second
	}
	start := time.Now()
	count := func() Progress {
		p := Progress{Elapsed: time.Since(start)}
		for _, r := range runs {
			for _, w := range r.workers {
				p.Allowed += w.allowed.Load()
				p.Denied += w.denied.Load()
				p.Errors += w.errs.Load()
			}
		}
		p.Requests = p.Allowed + p.Denied + p.Errors
		return p
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				cfg.Progress(count())
				return
			case <-t.C:
				cfg.Progress(count())
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
