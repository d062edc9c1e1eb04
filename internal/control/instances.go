package control

import (
	"context"
	"encoding/json"
	"time"
)

// Instance is a running instance of Sluice sharing the store.
type Instance struct {
	Name   string `json:"name"`
	Region string `json:"region,omitempty"`
	// AppliedRevision is the store revision of the layer it applied last.
	AppliedRevision int64     `json:"applied_revision"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// registrationTTL is how long an instance's key outlives the instance.
const registrationTTL = 10 * time.Second

// registerEvery bounds the writes of this instance's registration.
const registerEvery = 200 * time.Millisecond

// Instances returns the live instances, by name.
func (p *Plane) Instances(ctx context.Context) ([]Instance, error) {
	return list[Instance](ctx, p, prefixInstance, nil)
}

// registerRefresh is how often the registration is written again even
// without a change, in case the store lost it (an etcd lease that expired
// during an outage).
const registerRefresh = registrationTTL / 2

// register keeps this instance's key, with the revision it applied, in
// the store: written after each Apply, at most once per registerEvery.
func (p *Plane) register(ctx context.Context) {
	defer p.wg.Done()
	var written int64 = -1
	refresh := time.NewTicker(registerRefresh)
	defer refresh.Stop()
	for {
		p.mu.Lock()
		rev := p.status.Revision
		p.mu.Unlock()
		if rev != written {
			b, _ := json.Marshal(Instance{Name: p.opts.Instance, Region: p.opts.Region, AppliedRevision: rev, UpdatedAt: p.opts.Now().UTC()})
			if err := p.b.Register(ctx, prefixInstance+p.opts.Instance, b, registrationTTL); err != nil {
				if ctx.Err() != nil {
					return
				}
				p.opts.Logger.Warn("control plane: instance not registered", "err", err)
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
					return
				}
				continue
			}
			written = rev
			select {
			case <-time.After(registerEvery):
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-p.regWake:
		case <-refresh.C:
			written = -1
		case <-ctx.Done():
			return
		}
	}
}
