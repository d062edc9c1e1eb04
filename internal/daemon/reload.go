// Loading and reloading the policy file, and the status of the last load.

package daemon

import (
	"bytes"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/events"
	"github.com/sluicehq/sluice/internal/httpapi"
	"github.com/sluicehq/sluice/internal/policy"
)

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

// loadPolicy reads and parses the configured policy, or returns the
// built-in one.
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

func (d *Daemon) setApplied(p *policy.Policy, took time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.configEvents(d.applied, p)
	d.applied = p
	d.status.Version = p.Version
	d.status.Path = d.cfg.ConfigPath
	d.status.LoadedAt = time.Now()
	d.status.Reloads++
	d.status.LastError = ""
	d.status.LastErrorAt = nil
	d.metrics.ConfigApplied(p.Version, d.status.LoadedAt, took)
}

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

// Reload reads the configuration file again and applies it when it is
// valid; when it is not, the policy in force stays, and the error is logged,
// returned and shown in the configuration status. Without a configuration
// file it does nothing. It also reads the listeners' TLS certificate and
// key again, when they have them (a pair that fails to load is logged, and
// the one in force stays).
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
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	start := time.Now()
	files, err := policy.Read(d.cfg.ConfigPath)
	if err != nil {
		err = fmt.Errorf("daemon: config: %w", err)
		d.log.Error("configuration not reloaded; the policy in force stays", "err", err)
		d.setFailed(err)
		d.readFailed = true
		return err
	}
	data := policy.Snapshot(files)
	if !force && !d.readFailed && bytes.Equal(data, d.lastData) {
		return nil
	}
	d.lastData = data
	d.readFailed = false
	p, err := policy.ParseFiles(files, policy.Options{MergeDomains: d.cfg.MergeDomains})
	if err != nil {
		d.log.Error("configuration not reloaded; the policy in force stays", "err", err)
		d.setFailed(err)
		return err
	}
	// The control plane's layer, if any, applies over the new file.
	lp, err := d.layered(p)
	if err != nil {
		err = fmt.Errorf("daemon: config: the control plane's changes do not apply to it: %w", err)
		d.log.Error("configuration not reloaded; the policy in force stays", "err", err)
		d.setFailed(err)
		return err
	}
	d.mu.Lock()
	d.base = p
	d.mu.Unlock()
	d.eng.ApplyPolicy(lp)
	d.setApplied(lp, time.Since(start))
	d.log.Info("configuration reloaded", "path", d.cfg.ConfigPath, "version", lp.Version)
	return nil
}
