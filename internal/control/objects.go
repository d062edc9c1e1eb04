package control

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Rules returns the rules written through the control plane, by id.
func (p *Plane) Rules(ctx context.Context) ([]Rule, error) {
	return list(ctx, p, prefixRule, func(r *Rule, v int64) { r.Version = v })
}

// Rule returns the rule id, or ErrNotFound.
func (p *Plane) Rule(ctx context.Context, id string) (Rule, error) {
	var r Rule
	err := p.getObject(ctx, prefixRule+id, "rule", id, &r, func(v int64) { r.Version = v })
	return r, err
}

// PutRule creates or replaces the rule r.ID; created says it is new.
// r.Spec must be a JSON object whose "id", if any, is r.ID; Validate
// checks the rule itself.
func (p *Plane) PutRule(ctx context.Context, a Actor, r Rule, ifVersion int64, reason string) (Rule, bool, error) {
	if err := checkID("id", r.ID); err != nil {
		return Rule{}, false, err
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(r.Spec, &spec); err != nil || spec == nil {
		return Rule{}, false, &FieldError{Field: "spec", Msg: "must be a JSON object"}
	}
	if raw, ok := spec["id"]; ok {
		var id string
		if json.Unmarshal(raw, &id) != nil || id != r.ID {
			return Rule{}, false, &FieldError{Field: "spec.id", Msg: fmt.Sprintf("must be %q, the rule's id", r.ID)}
		}
	} else {
		spec["id"], _ = json.Marshal(r.ID)
	}
	specJSON, _ := json.Marshal(spec)
	var out Rule
	w, err := p.write(ctx, a, change{object: "rule", id: r.ID, key: prefixRule + r.ID, ifVersion: ifVersion, validate: true, reason: reason,
		next: func(_ []byte, v int64) (any, error) {
			out = Rule{ID: r.ID, Spec: specJSON, Version: v, UpdatedAt: p.opts.Now().UTC(), UpdatedBy: a.Name}
			return out, nil
		}})
	return out, w.created, err
}

// DeleteRule deletes the rule id.
func (p *Plane) DeleteRule(ctx context.Context, a Actor, id string, ifVersion int64, reason string) error {
	if err := checkID("id", id); err != nil {
		return err
	}
	_, err := p.write(ctx, a, change{object: "rule", id: id, key: prefixRule + id, ifVersion: ifVersion, mustExist: true, validate: true, reason: reason,
		next: func([]byte, int64) (any, error) { return nil, nil }})
	return err
}

// Identity returns the tier of the identity kind/value, or ErrNotFound.
func (p *Plane) Identity(ctx context.Context, kind, value string) (Identity, error) {
	if err := checkKind("kind", kind); err != nil {
		return Identity{}, err
	}
	var id Identity
	err := p.getObject(ctx, identityKey(kind, value), "identity", kind+":"+value, &id, func(v int64) { id.Version = v })
	return id, err
}

// SetTier gives the identity id.Kind/id.Value the tier id.Tier; an empty
// tier removes the identity's entry.
func (p *Plane) SetTier(ctx context.Context, a Actor, id Identity, ifVersion int64, reason string) (Identity, error) {
	if err := checkKind("kind", id.Kind); err != nil {
		return Identity{}, err
	}
	if id.Value == "" {
		return Identity{}, &FieldError{Field: "value", Msg: "required"}
	}
	var out Identity
	_, err := p.write(ctx, a, change{object: "identity", id: id.Kind + ":" + id.Value, key: identityKey(id.Kind, id.Value),
		ifVersion: ifVersion, mustExist: id.Tier == "", validate: true, reason: reason,
		next: func(_ []byte, v int64) (any, error) {
			if id.Tier == "" {
				out = Identity{Kind: id.Kind, Value: id.Value}
				return nil, nil
			}
			out = Identity{Kind: id.Kind, Value: id.Value, Tier: id.Tier, Version: v, UpdatedAt: p.opts.Now().UTC(), UpdatedBy: a.Name}
			return out, nil
		}})
	return out, err
}

// Overrides returns the overrides not expired, of the identity kind/value,
// or all of them when kind and value are "".
func (p *Plane) Overrides(ctx context.Context, kind, value string) ([]Override, error) {
	all, err := list(ctx, p, prefixOverride, func(o *Override, v int64) { o.Version = v })
	if err != nil {
		return nil, err
	}
	now := p.opts.Now()
	out := all[:0]
	for _, o := range all {
		if o.ExpiresAt.After(now) && (kind == "" || o.Kind == kind) && (value == "" || o.Value == value) {
			out = append(out, o)
		}
	}
	return out, nil
}

// PutOverride writes the override o, with a new id when o.ID is "". Its
// expires_at must be in the future and its reason given; o.Version > 0
// requires the override at that version.
func (p *Plane) PutOverride(ctx context.Context, a Actor, o Override) (Override, error) {
	if o.ID == "" {
		o.ID = newID()
	}
	if err := checkOverride(o, p.opts.Now()); err != nil {
		return Override{}, err
	}
	var out Override
	_, err := p.write(ctx, a, change{object: "override", id: o.ID, key: prefixOverride + o.ID, ifVersion: o.Version, validate: true, reason: o.Reason,
		next: func(cur []byte, v int64) (any, error) {
			out = o
			out.Version, out.CreatedAt, out.CreatedBy = v, p.opts.Now().UTC(), a.Name
			var old Override
			if cur != nil && json.Unmarshal(cur, &old) == nil {
				out.CreatedAt, out.CreatedBy = old.CreatedAt, old.CreatedBy
			}
			return out, nil
		}})
	return out, err
}

// checkOverride checks the fields of an override at now.
func checkOverride(o Override, now time.Time) error {
	if err := checkID("id", o.ID); err != nil {
		return err
	}
	if err := checkKind("kind", o.Kind); err != nil {
		return err
	}
	switch {
	case o.Value == "":
		return &FieldError{Field: "value", Msg: "required"}
	case len(o.Limits) == 0:
		return &FieldError{Field: "limits", Msg: "required: the limits by rule id"}
	case o.ExpiresAt.IsZero():
		return &FieldError{Field: "expires_at", Msg: "required"}
	case !o.ExpiresAt.After(now):
		return &FieldError{Field: "expires_at", Msg: "must be in the future"}
	case strings.TrimSpace(o.Reason) == "":
		return &FieldError{Field: "reason", Msg: "required"}
	}
	for rule, l := range o.Limits {
		f := "limits." + rule
		if rule == "" {
			return &FieldError{Field: "limits", Msg: "empty rule id"}
		}
		if l.Limit < 0 {
			return &FieldError{Field: f + ".limit", Msg: "must not be negative"}
		}
		if l.Burst < 0 {
			return &FieldError{Field: f + ".burst", Msg: "must not be negative"}
		}
		if l.Window != "" {
			if d, err := time.ParseDuration(l.Window); err != nil || d <= 0 {
				return &FieldError{Field: f + ".window", Msg: "must be a positive duration such as 1m"}
			}
		}
		if l.Algorithm != "" && !algorithms[l.Algorithm] {
			return &FieldError{Field: f + ".algorithm", Msg: "unknown algorithm " + l.Algorithm}
		}
	}
	return nil
}

// DeleteOverride deletes the override id.
func (p *Plane) DeleteOverride(ctx context.Context, a Actor, id string, ifVersion int64, reason string) error {
	if err := checkID("id", id); err != nil {
		return err
	}
	_, err := p.write(ctx, a, change{object: "override", id: id, key: prefixOverride + id, ifVersion: ifVersion, mustExist: true, validate: true, reason: reason,
		next: func([]byte, int64) (any, error) { return nil, nil }})
	return err
}

// Throttles returns the throttles in force (not expired, not lifted).
func (p *Plane) Throttles(ctx context.Context) ([]Throttle, error) {
	all, err := list(ctx, p, prefixThrottle, func(t *Throttle, v int64) { t.Version = v })
	if err != nil {
		return nil, err
	}
	now := p.opts.Now()
	out := all[:0]
	for _, t := range all {
		if t.ExpiresAt.After(now) {
			out = append(out, t)
		}
	}
	return out, nil
}

// PutThrottle starts the throttle t (a new id when t.ID is ""); it lasts
// until t.ExpiresAt, or t.Duration from now when ExpiresAt is zero.
func (p *Plane) PutThrottle(ctx context.Context, a Actor, t Throttle) (Throttle, error) {
	now := p.opts.Now()
	if t.ID == "" {
		t.ID = newID()
	}
	if t.ExpiresAt.IsZero() && t.Duration > 0 {
		t.ExpiresAt = now.Add(t.Duration).UTC()
	}
	if err := checkThrottle(t, now); err != nil {
		return Throttle{}, err
	}
	var out Throttle
	_, err := p.write(ctx, a, change{object: "throttle", id: t.ID, key: prefixThrottle + t.ID, ifVersion: t.Version, reason: t.Reason,
		next: func(_ []byte, v int64) (any, error) {
			out = t
			out.Version, out.CreatedAt, out.CreatedBy = v, now.UTC(), a.Name
			return out, nil
		}})
	return out, err
}

// checkThrottle checks the fields of a throttle at now.
func checkThrottle(t Throttle, now time.Time) error {
	if err := checkID("id", t.ID); err != nil {
		return err
	}
	switch {
	case t.Scope != ScopeGlobal && t.Scope != ScopeRegion && t.Scope != ScopeClient:
		return &FieldError{Field: "scope", Msg: `must be "global", "region" or "client"`}
	case t.Scope != ScopeGlobal && t.Target == "":
		return &FieldError{Field: "target", Msg: "required for scope " + t.Scope}
	case t.Scope == ScopeGlobal && t.Target != "":
		return &FieldError{Field: "target", Msg: "not allowed for scope global"}
	case !(t.ReductionPercent >= 0 && t.ReductionPercent <= 100):
		return &FieldError{Field: "reduction_percent", Msg: "must be from 0 to 100"}
	case t.Duration < 0 || (t.ExpiresAt.IsZero() && t.Duration == 0):
		return &FieldError{Field: "duration", Msg: "must be positive"}
	case !t.ExpiresAt.After(now):
		return &FieldError{Field: "expires_at", Msg: "must be in the future"}
	case strings.TrimSpace(t.Reason) == "":
		return &FieldError{Field: "reason", Msg: "required"}
	}
	return nil
}

// LiftThrottle ends the throttle id now; it stays readable in the audit
// trail.
func (p *Plane) LiftThrottle(ctx context.Context, a Actor, id, reason string) (Throttle, error) {
	if err := checkID("id", id); err != nil {
		return Throttle{}, err
	}
	now := p.opts.Now().UTC()
	var out Throttle
	_, err := p.write(ctx, a, change{object: "throttle", id: id, key: prefixThrottle + id, mustExist: true, action: "lift", reason: reason,
		next: func(cur []byte, v int64) (any, error) {
			if err := json.Unmarshal(cur, &out); err != nil {
				return nil, fmt.Errorf("control: throttle %q: %w", id, err)
			}
			if !out.ExpiresAt.After(now) {
				return nil, fmt.Errorf("throttle %q already ended: %w", id, ErrNotFound)
			}
			out.ExpiresAt, out.Version = now, v
			return out, nil
		}})
	return out, err
}

// Tokens returns the admin tokens (their SHA-256 only), by name.
func (p *Plane) Tokens(ctx context.Context) ([]Token, error) {
	return list[Token](ctx, p, prefixToken, nil)
}

// PutToken creates or replaces the token t.Name; t.SHA256 is the hex
// SHA-256 of its secret.
func (p *Plane) PutToken(ctx context.Context, a Actor, t Token) error {
	if err := checkID("name", t.Name); err != nil {
		return err
	}
	if t.Role != RoleViewer && t.Role != RoleOperator && t.Role != RoleAdmin {
		return &FieldError{Field: "role", Msg: `must be "viewer", "operator" or "admin"`}
	}
	if len(t.SHA256) != 64 || strings.Trim(strings.ToLower(t.SHA256), "0123456789abcdef") != "" {
		return &FieldError{Field: "sha256", Msg: "must be 64 hex digits"}
	}
	t.SHA256 = strings.ToLower(t.SHA256)
	_, err := p.write(ctx, a, change{object: "token", id: t.Name, key: prefixToken + t.Name,
		next: func([]byte, int64) (any, error) { return t, nil }})
	return err
}

// DeleteToken deletes the token name.
func (p *Plane) DeleteToken(ctx context.Context, a Actor, name, reason string) error {
	if err := checkID("name", name); err != nil {
		return err
	}
	_, err := p.write(ctx, a, change{object: "token", id: name, key: prefixToken + name, mustExist: true, reason: reason,
		next: func([]byte, int64) (any, error) { return nil, nil }})
	return err
}

// AuditFilter selects audit entries; zero fields select all.
type AuditFilter struct {
	Object, ID, Actor string
	Since             time.Time
	// Limit is the most entries returned; 0 is 100.
	Limit int
}

// Audit returns the audit entries f selects, newest first.
func (p *Plane) Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	kvs, _, err := p.b.Get(ctx, prefixAudit)
	if err != nil {
		return nil, err
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var out []AuditEntry
	for i := len(kvs) - 1; i >= 0; i-- {
		var e AuditEntry
		if json.Unmarshal(kvs[i].Value, &e) != nil {
			continue
		}
		e.Revision = kvs[i].ModRevision
		if (f.Object != "" && e.Object != f.Object) || (f.ID != "" && e.ID != f.ID) ||
			(f.Actor != "" && e.Actor.Name != f.Actor) || (!f.Since.IsZero() && e.Time.Before(f.Since)) {
			continue
		}
		out = append(out, e)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Revision > out[j].Revision })
	if len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// getObject decodes the object at key into v and calls setVersion with its
// version; ErrNotFound when absent.
func (p *Plane) getObject(ctx context.Context, key, object, id string, v any, setVersion func(int64)) error {
	kv, err := p.getKey(ctx, key)
	if err != nil {
		return err
	}
	if kv == nil {
		return fmt.Errorf("%s %q: %w", object, id, ErrNotFound)
	}
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return fmt.Errorf("control: %s: %w", key, err)
	}
	setVersion(kv.Version)
	return nil
}
