package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/atomicfile"
	"github.com/sluicehq/sluice/internal/policy"
)

// Options configure a Plane.
type Options struct {
	// Backend holds the objects; required.
	Backend Backend
	// Instance names this instance among those sharing the store; the
	// default is hostname-pid.
	Instance string
	// Region is this instance's region, for throttles of scope "region".
	Region string
	// CacheDir keeps the last applied layer (applied.json), applied at
	// Open when the store cannot be reached; "" keeps none.
	CacheDir string
	// Validate is called with the layer a write of a rule, an identity's
	// tier, an override or a config would make; when it fails nothing is
	// written and its error is returned. Nil accepts every layer.
	Validate func(*policy.Layer) error
	// Apply is called with the whole layer at Open and after every change
	// seen by the watch, and when an override or throttle expires; one
	// call at a time. Nil ignores layers.
	Apply func(*policy.Layer) error
	// Now is the clock; the default is time.Now.
	Now func() time.Time
	// Logger logs the watch's trouble; the default discards.
	Logger *slog.Logger
	// Audit is called with each change this Plane writes, once committed.
	Audit func(AuditEntry)
}

// Status is the state of a Plane's watch.
type Status struct {
	// Revision is the store revision of the layer last applied; 0 before
	// any.
	Revision int64 `json:"applied_revision"`
	// Reachable says the store answered the last call.
	Reachable bool `json:"reachable"`
	// FromCache says the layer applied came from CacheDir, not the store.
	FromCache bool   `json:"from_cache,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

// Plane is the control plane of one instance: it reads and writes the
// objects in the Backend, and watches it to apply the layer they make.
// It is safe for concurrent use.
type Plane struct {
	b    Backend
	opts Options

	cancel context.CancelFunc
	wg     sync.WaitGroup
	// regCtx lives as long as the Plane: this instance's registration.
	regCtx context.Context

	// mu guards the fields below.
	mu     sync.Mutex
	state  map[string]KV // the keys of the layer's objects, as last seen
	layers layerCache    // state's objects decoded, for the next build
	status Status
	// regWake wakes the registration writer after an Apply.
	regWake chan struct{}
}

// Open starts the Plane: it reads the store and applies the layer, or,
// when the store cannot be reached, applies the layer in CacheDir and keeps
// trying the store in the background. An error is returned only for bad
// Options or when Apply rejects the first layer.
func Open(ctx context.Context, o Options) (*Plane, error) {
	if o.Backend == nil {
		return nil, errors.New("control: no Backend")
	}
	if o.Instance == "" {
		h, _ := os.Hostname()
		o.Instance = h + "-" + strconv.Itoa(os.Getpid())
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Plane{b: o.Backend, opts: o, state: map[string]KV{}, regWake: make(chan struct{}, 1)}
	runCtx, cancel := context.WithCancel(context.Background())
	p.cancel, p.regCtx = cancel, runCtx

	kvs, rev, err := p.loadAll(ctx)
	if err != nil {
		p.setErr(err)
		if l, ok := p.readCache(); ok {
			if err := p.callApply(l); err != nil {
				cancel()
				return nil, fmt.Errorf("control: apply the cached layer: %w", err)
			}
			p.mu.Lock()
			p.status.Revision, p.status.FromCache = l.Revision, true
			p.mu.Unlock()
		}
		rev = 0
	} else {
		p.mu.Lock()
		p.state = kvs
		p.mu.Unlock()
		if err := p.applyState(rev); err != nil {
			cancel()
			return nil, err
		}
	}
	p.wg.Add(2)
	go p.watch(runCtx, rev)
	go p.register(runCtx)
	return p, nil
}

// Close stops the watch and the registration; it does not close the
// Backend.
func (p *Plane) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

// Status returns the state of the watch.
func (p *Plane) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// loadAll reads the keys of the layer's objects.
func (p *Plane) loadAll(ctx context.Context) (map[string]KV, int64, error) {
	kvs, rev, err := p.b.Get(ctx, "")
	if err != nil {
		return nil, 0, err
	}
	m := make(map[string]KV, len(kvs))
	for _, kv := range kvs {
		if layerKey(kv.Key) {
			m[kv.Key] = kv
		}
	}
	return m, rev, nil
}

// applyState builds the layer of the state at rev and applies it.
func (p *Plane) applyState(rev int64) error {
	p.mu.Lock()
	l := p.layers.build(p.state, rev, p.opts.Region, p.opts.Now())
	p.mu.Unlock()
	if err := p.callApply(l); err != nil {
		p.setErr(fmt.Errorf("apply revision %d: %w", rev, err))
		return fmt.Errorf("control: apply revision %d: %w", rev, err)
	}
	p.mu.Lock()
	p.status = Status{Revision: rev, Reachable: true}
	p.mu.Unlock()
	p.writeCache(l)
	select {
	case p.regWake <- struct{}{}:
	default:
	}
	return nil
}

func (p *Plane) callApply(l *policy.Layer) error {
	if p.opts.Apply == nil {
		return nil
	}
	return p.opts.Apply(l)
}

func (p *Plane) setErr(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status.LastError = err.Error()
	if errors.Is(err, ErrUnavailable) {
		p.status.Reachable = false
	}
}

// watch follows the store from rev+1 (rev 0: read everything first),
// applying each change, and applies again when an override or throttle
// expires. It retries an unreachable store with backoff.
func (p *Plane) watch(ctx context.Context, rev int64) {
	defer p.wg.Done()
	backoff := 50 * time.Millisecond
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	for ctx.Err() == nil {
		if rev == 0 {
			kvs, r, err := p.loadAll(ctx)
			if err != nil {
				p.setErr(err)
				p.opts.Logger.Warn("control plane: store unreachable", "err", err, "retry_in", backoff)
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
					return
				}
				backoff = min(backoff*2, 5*time.Second)
				continue
			}
			p.mu.Lock()
			p.state = kvs
			p.mu.Unlock()
			rev = r
			if err := p.applyState(rev); err != nil {
				p.opts.Logger.Error("control plane: layer not applied", "err", err)
			}
		}
		p.armExpiry(expiry)
		wctx, wcancel := context.WithCancel(ctx)
		ch := p.b.Watch(wctx, "", rev+1)
		rev = p.follow(ctx, ch, rev, expiry)
		wcancel()
		for range ch { // drain until the watch goroutine ends
		}
		if rev != 0 {
			backoff = 50 * time.Millisecond
		}
		select {
		case <-time.After(backoff / 2):
		case <-ctx.Done():
			return
		}
	}
}

// follow applies the responses of ch until it ends; it returns the last
// revision applied, or 0 when everything must be read again.
func (p *Plane) follow(ctx context.Context, ch <-chan WatchResponse, rev int64, expiry *time.Timer) int64 {
	for {
		select {
		case <-ctx.Done():
			return rev
		case <-expiry.C:
			if err := p.applyState(rev); err != nil {
				p.opts.Logger.Error("control plane: layer not applied", "err", err)
			}
			p.armExpiry(expiry)
		case r, ok := <-ch:
			switch {
			case !ok:
				return rev
			case r.Compacted:
				p.opts.Logger.Warn("control plane: store compacted past the watch; reading everything", "revision", rev)
				return 0
			case r.Err != nil:
				p.setErr(r.Err)
				p.opts.Logger.Warn("control plane: watch broken; resuming", "err", r.Err, "revision", rev)
				return rev
			}
			changed := false
			p.mu.Lock()
			for _, ev := range r.Events {
				if !layerKey(ev.KV.Key) {
					continue // the audit trail, registrations: no change of layer
				}
				changed = true
				if ev.Delete {
					delete(p.state, ev.KV.Key)
				} else {
					p.state[ev.KV.Key] = ev.KV
				}
			}
			p.mu.Unlock()
			if r.Revision > rev {
				rev = r.Revision
			}
			if !changed {
				continue
			}
			if err := p.applyState(rev); err != nil {
				p.opts.Logger.Error("control plane: layer not applied", "err", err)
			}
			p.armExpiry(expiry)
		}
	}
}

// armExpiry sets t to fire when the earliest override or throttle in the
// state expires.
func (p *Plane) armExpiry(t *time.Timer) {
	p.mu.Lock()
	next := p.layers.earliestExpiry(p.state, p.opts.Now())
	p.mu.Unlock()
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	d := time.Hour
	if !next.IsZero() {
		d = next.Sub(p.opts.Now()) + time.Millisecond
	}
	t.Reset(d)
}

// cacheFile is the layer last applied, in CacheDir.
const cacheFile = "applied.json"

// writeCache keeps l in CacheDir, replacing the file atomically.
func (p *Plane) writeCache(l *policy.Layer) {
	if p.opts.CacheDir == "" {
		return
	}
	b, err := json.Marshal(l)
	if err == nil {
		err = os.MkdirAll(p.opts.CacheDir, 0o700)
	}
	if err == nil {
		err = atomicfile.Write(filepath.Join(p.opts.CacheDir, cacheFile), b)
	}
	if err != nil {
		p.opts.Logger.Warn("control plane: applied layer not cached", "err", err)
	}
}

// readCache returns the layer in CacheDir, if any.
func (p *Plane) readCache() (*policy.Layer, bool) {
	if p.opts.CacheDir == "" {
		return nil, false
	}
	b, err := os.ReadFile(filepath.Join(p.opts.CacheDir, cacheFile))
	if err != nil {
		return nil, false
	}
	var l policy.Layer
	if err := json.Unmarshal(b, &l); err != nil {
		p.opts.Logger.Warn("control plane: cached layer unreadable", "err", err)
		return nil, false
	}
	l.Region = p.opts.Region
	return &l, true
}
