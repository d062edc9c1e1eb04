package control

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// configRulePrefix starts the id of the rule a Config becomes.
const configRulePrefix = "config-"

// algorithms are the configuration file's algorithm names.
var algorithms = map[string]bool{
	"fixed_window": true, "sliding_window_log": true, "sliding_window_counter": true,
	"token_bucket": true, "leaky_bucket": true, "gcra": true,
}

// Propagation states of a config.
const (
	PropagationPending = "pending" // some live instance has not applied it yet
	PropagationApplied = "applied" // every live instance has
)

// ConfigState is a config and how far it has reached.
type ConfigState struct {
	Config Config `json:"config"`
	// Revision is the store revision the current version was written at.
	Revision          int64  `json:"revision"`
	PropagationStatus string `json:"propagation_status"`
	// Lagging are the live instances that have not applied Revision yet.
	Lagging []Instance `json:"lagging_instances,omitempty"`
}

// configRule is the rule, in the configuration file's format, that c
// becomes: a limit of BaseRate a second for ClientID on Resource.
// GlobalLimit becomes the rule's global_limit (a second, as BaseRate),
// its only limit when BaseRate is 0; Priority and AdaptiveConfig are kept
// but not enforced.
func configRule(c Config) ([]byte, error) {
	spec := map[string]any{
		"id":        configRulePrefix + c.ID,
		"match":     map[string]any{"resource": c.Resource, "client": []string{c.ClientID}},
		"dimension": "client",
		"window":    "1s",
	}
	if c.BaseRate > 0 {
		spec["algorithm"], spec["limit"] = c.Algorithm, c.BaseRate
	}
	if c.BurstCapacity > 0 {
		spec["burst"] = c.BurstCapacity
	}
	if len(c.CostMultipliers) > 0 {
		spec["cost_multipliers"] = c.CostMultipliers
	}
	if c.GlobalLimit > 0 {
		spec["global_limit"] = c.GlobalLimit
	}
	return json.Marshal(spec)
}

// checkConfig checks the fields of a config.
func checkConfig(c Config) error {
	if err := checkID("id", c.ID); err != nil {
		return err
	}
	switch {
	case c.ClientID == "":
		return &FieldError{Field: "client_id", Msg: "required"}
	case c.Resource == "":
		return &FieldError{Field: "resource", Msg: "required"}
	case c.GlobalLimit < 0:
		return &FieldError{Field: "global_limit", Msg: "must not be negative"}
	case c.BaseRate < 0 || c.BaseRate == 0 && c.GlobalLimit == 0:
		return &FieldError{Field: "base_rate", Msg: "must be positive, or 0 with a global_limit"}
	case c.BaseRate == 0 && c.Algorithm != "":
		return &FieldError{Field: "algorithm", Msg: "a config with only a global_limit counts it in fixed windows: leave algorithm out, or set base_rate"}
	case c.BaseRate == 0 && c.BurstCapacity != 0:
		return &FieldError{Field: "burst_capacity", Msg: "a config with only a global_limit has no burst: leave burst_capacity out, or set base_rate"}
	case c.BaseRate > 0 && !algorithms[c.Algorithm]:
		return &FieldError{Field: "algorithm", Msg: "must be one of fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra"}
	case c.BurstCapacity < 0:
		return &FieldError{Field: "burst_capacity", Msg: "must not be negative"}
	case len(c.AdaptiveConfig) > 0 && !json.Valid(c.AdaptiveConfig):
		return &FieldError{Field: "adaptive_config", Msg: "must be JSON"}
	}
	for k, m := range c.CostMultipliers {
		if k == "" || !(m > 0) {
			return &FieldError{Field: "cost_multipliers." + k, Msg: "must be a positive number"}
		}
	}
	return nil
}

// configVersionKey is the key of version v of config id.
func configVersionKey(id string, v int64) string {
	return fmt.Sprintf("%s%s/%020d", prefixConfigVer, id, v)
}

// PutConfig creates or replaces the config c.ID, keeping every version;
// created says it is new.
func (p *Plane) PutConfig(ctx context.Context, a Actor, c Config, ifVersion int64) (Config, bool, error) {
	if err := checkConfig(c); err != nil {
		return Config{}, false, err
	}
	out, w, err := p.writeConfig(ctx, a, c, ifVersion, "", "")
	return out, w.created, err
}

// writeConfig writes c as the next version of its config, and the version
// in the history, in one Txn.
func (p *Plane) writeConfig(ctx context.Context, a Actor, c Config, ifVersion int64, action, reason string) (Config, written, error) {
	var out Config
	w, err := p.write(ctx, a, change{object: "config", id: c.ID, key: prefixConfig + c.ID, ifVersion: ifVersion,
		mustExist: action == "rollback", validate: true, action: action, reason: reason,
		next: func(_ []byte, v int64) (any, error) {
			out = c
			out.Version, out.UpdatedAt, out.UpdatedBy = v, p.opts.Now().UTC(), a.Name
			return out, nil
		},
		extra: func(v int64, value []byte) []Op {
			return []Op{{Key: configVersionKey(c.ID, v), Value: value, IfVersion: AnyVersion}}
		}})
	return out, w, err
}

// Config returns the config id with its propagation status.
func (p *Plane) Config(ctx context.Context, id string) (ConfigState, error) {
	kv, err := p.getKey(ctx, prefixConfig+id)
	if err != nil {
		return ConfigState{}, err
	}
	if kv == nil {
		return ConfigState{}, fmt.Errorf("config %q: %w", id, ErrNotFound)
	}
	var st ConfigState
	if err := json.Unmarshal(kv.Value, &st.Config); err != nil {
		return ConfigState{}, fmt.Errorf("control: %s: %w", kv.Key, err)
	}
	st.Config.Version, st.Revision = kv.Version, kv.ModRevision
	insts, err := p.Instances(ctx)
	if err != nil {
		return ConfigState{}, err
	}
	st.PropagationStatus = PropagationApplied
	for _, in := range insts {
		if in.AppliedRevision < st.Revision {
			st.Lagging = append(st.Lagging, in)
			st.PropagationStatus = PropagationPending
		}
	}
	return st, nil
}

// ConfigVersions returns every version of the config id, oldest first.
func (p *Plane) ConfigVersions(ctx context.Context, id string) ([]Config, error) {
	if err := checkID("id", id); err != nil {
		return nil, err
	}
	vs, err := list[Config](ctx, p, prefixConfigVer+id+"/", nil)
	if err != nil {
		return nil, err
	}
	if len(vs) == 0 {
		return nil, fmt.Errorf("config %q: %w", id, ErrNotFound)
	}
	return vs, nil
}

// RollbackConfig writes the content of version toVersion of the config id
// as its next version.
func (p *Plane) RollbackConfig(ctx context.Context, a Actor, id string, toVersion int64, reason string) (Config, error) {
	if err := checkID("id", id); err != nil {
		return Config{}, err
	}
	if toVersion <= 0 {
		return Config{}, &FieldError{Field: "version", Msg: "must be positive"}
	}
	kv, err := p.getKey(ctx, configVersionKey(id, toVersion))
	if err != nil {
		return Config{}, err
	}
	if kv == nil {
		return Config{}, fmt.Errorf("config %q version %d: %w", id, toVersion, ErrNotFound)
	}
	var c Config
	if err := json.Unmarshal(kv.Value, &c); err != nil {
		return Config{}, fmt.Errorf("control: %s: %w", kv.Key, err)
	}
	if strings.TrimSpace(reason) == "" {
		reason = fmt.Sprintf("rollback to version %d", toVersion)
	}
	out, _, err := p.writeConfig(ctx, a, c, 0, "rollback", reason)
	return out, err
}
