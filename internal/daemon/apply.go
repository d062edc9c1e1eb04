// Applying a configuration, whole or not at all: the policy file's (on
// Apply, Reload and the file watcher's changes) or the control plane's
// layer over it. Each apply composes the new configuration aside, has
// every part of the daemon it reaches accept it, and only then commits it
// in one step; a configuration refused anywhere changes nothing.

package daemon

import (
	"bytes"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/httpapi"
	"github.com/sluicehq/sluice/internal/policy"
)

// configuration is what the daemon decides checks by. It is never
// modified: an apply replaces it whole.
type configuration struct {
	// file is the configuration file's policy, or the built-in one.
	file *policy.Policy
	// layer is the control plane's layer over file; nil before the
	// first, and without a control plane.
	layer *policy.Layer
	// policy is file with layer applied: the policy in force.
	policy *policy.Policy
}

// Apply puts p in force as the configuration file's policy, whole or not
// at all. The control plane's layer in force, if any, is applied over p,
// and the store must accept every limit of the result (see
// engine.Engine.Accepts); when either fails, nothing changes: the
// configuration in force stays, and the error is logged, returned and
// shown in the configuration status (GET /api/v1/config/status, the
// sluice_config_last_reload_successful metric, a rate_limit_config_rejected
// event). Checks already running finish on the policy they started with.
// Applies are serialized.
//
// Reload reads the configuration file and applies what it reads; a later
// change of the file, seen by the watcher or by Reload, replaces p.
func (d *Daemon) Apply(p *policy.Policy) error {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	return d.applyFile(p, time.Now())
}

// Reload reads the configuration file again and applies it (see Apply);
// when it cannot be read or is not valid, the policy in force stays, and
// the error is logged, returned and shown in the configuration status.
// Without a configuration file it does nothing. It also reads the
// listeners' TLS certificate and key again, when they have them (a pair
// that fails to load is logged, and the one in force stays): the
// certificate is not part of the configuration, and neither keeps the
// other from applying.
func (d *Daemon) Reload() error {
	d.reloadCert()
	return d.reload(true)
}

// reload reloads the configuration; unless force is set, contents equal to
// those last loaded are skipped, except after a reload that could not read
// the file, whose failure only applying the contents again clears.
func (d *Daemon) reload(force bool) error {
	if d.cfg.ConfigPath == "" {
		return nil
	}
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	start := time.Now()
	files, err := policy.Read(d.cfg.ConfigPath)
	if err != nil {
		d.readFailed = true
		return d.fileRejected(fmt.Errorf("daemon: config: %w", err))
	}
	data := policy.Snapshot(files)
	if !force && !d.readFailed && bytes.Equal(data, d.lastData) {
		return nil
	}
	d.lastData = data
	d.readFailed = false
	p, err := policy.ParseFiles(files, policy.Options{MergeDomains: d.cfg.MergeDomains})
	if err != nil {
		return d.fileRejected(err)
	}
	return d.applyFile(p, start)
}

// applyFile applies file, the configuration file's policy, over which the
// control plane's layer in force stays; start is when its load began. It
// requires applyMu held.
func (d *Daemon) applyFile(file *policy.Policy, start time.Time) error {
	c, err := d.compose(file, d.config.Load().layer)
	if err != nil {
		return d.fileRejected(fmt.Errorf("daemon: config: the control plane's changes do not apply to it: %w", err))
	}
	if err := d.accept(c); err != nil {
		return d.fileRejected(fmt.Errorf("daemon: config: %w", err))
	}
	d.commit(c, time.Since(start))
	d.log.Info("configuration reloaded", "path", d.cfg.ConfigPath, "version", c.policy.Version)
	return nil
}

// applyLayer applies l, the control plane's layer, over the file's policy
// in force; when it does not apply, the configuration in force stays and
// the error is shown in the configuration status. It is the control
// plane's Apply.
func (d *Daemon) applyLayer(l *policy.Layer) error {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	start := time.Now()
	c, err := d.compose(d.config.Load().file, l)
	if err == nil {
		err = d.accept(c)
	}
	if err != nil {
		err = fmt.Errorf("daemon: control plane revision %d: %w", l.Revision, err)
		d.log.Error("control plane change not applied; the policy in force stays", "err", err)
		d.setFailed(err)
		return err
	}
	d.commit(c, time.Since(start))
	d.log.Debug("control plane change applied", "revision", l.Revision, "version", c.policy.Version)
	return nil
}

// compose returns the configuration of file with layer over it (none when
// layer is nil). The policy in force lends what did not change (see
// policy.Policy.WithLayer). Nothing is put in force.
func (d *Daemon) compose(file *policy.Policy, layer *policy.Layer) (*configuration, error) {
	c := &configuration{file: file, layer: layer, policy: file}
	if layer == nil {
		return c, nil
	}
	var err error
	if c.policy, err = file.WithLayer(layer, d.config.Load().policy); err != nil {
		return nil, err
	}
	return c, nil
}

// accept reports whether every part of the daemon that c's policy reaches
// can serve it: nil when all can. The engine's store, and its in-process
// limiter of the local failure mode, must decide each of its limits (a
// sliding window log beyond the store's bound, they cannot). A part that
// could refuse a policy is asked here, before anything is put in force.
func (d *Daemon) accept(c *configuration) error {
	return d.eng.Accepts(c.policy)
}

// commit puts c in force: the engine decides by c's policy from its next
// check on, and the daemon's views (the configuration status, GET
// /api/v1/policy, the admin API's effective limits) show c whole. It
// cannot fail. It requires applyMu held, or the daemon not yet serving.
func (d *Daemon) commit(c *configuration, took time.Duration) {
	d.eng.ApplyPolicy(c.policy)
	prev := d.config.Swap(c)
	var prevPolicy *policy.Policy
	if prev != nil {
		prevPolicy = prev.policy
	}
	d.setApplied(prevPolicy, c.policy, took)
}

// fileRejected logs that the configuration file was not applied, shows
// err in the configuration status, and returns err.
func (d *Daemon) fileRejected(err error) error {
	d.log.Error("configuration not reloaded; the policy in force stays", "err", err)
	d.setFailed(err)
	return err
}

// loadPolicy reads and parses the configured policy, or returns the
// built-in one. It returns the contents read too, when it could read them.
func (d *Daemon) loadPolicy() (*policy.Policy, []byte, error) {
	if d.cfg.ConfigPath == "" {
		return policy.Default(), nil, nil
	}
	files, err := policy.Read(d.cfg.ConfigPath)
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: config: %w", err)
	}
	data := policy.Snapshot(files)
	p, err := policy.ParseFiles(files, policy.Options{MergeDomains: d.cfg.MergeDomains})
	if err != nil {
		return nil, data, err
	}
	return p, data, nil
}

func configName(path string) string {
	if path == "" {
		return "built-in example policy"
	}
	return path
}

// ConfigStatus returns the configuration status served on GET
// /api/v1/config/status.
func (d *Daemon) ConfigStatus() httpapi.ConfigStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.status
	if s.LastErrorAt != nil {
		t := *s.LastErrorAt
		s.LastErrorAt = &t
	}
	return s
}

// setApplied records that next is in force after prev (nil at start):
// the configuration status, the metrics and the events.
func (d *Daemon) setApplied(prev, next *policy.Policy, took time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.configEvents(prev, next)
	d.status.Version = next.Version
	d.status.Path = d.cfg.ConfigPath
	d.status.LoadedAt = time.Now()
	d.status.Reloads++
	d.status.LastError = ""
	d.status.LastErrorAt = nil
	d.metrics.ConfigApplied(next.Version, d.status.LoadedAt, took)
}

// setFailed records that a configuration was refused with err: the
// configuration status, the metrics and the events.
func (d *Daemon) setFailed(err error) {
	t := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.status.LastError = err.Error()
	d.status.LastErrorAt = &t
	d.metrics.ConfigFailed()
	at := t
	if d.cfg.Now != nil { // the engine's clock, as the other events
		at = d.cfg.Now()
	}
	d.events.Emit(events.Event{Type: events.ConfigRejected, Time: at, Severity: events.SeverityError,
		Path: d.cfg.ConfigPath, Version: d.status.Version, Error: err.Error()})
}
