// Package control is Sluice's control plane: the objects an operator
// changes while Sluice runs (rules, identities' tiers, temporary overrides,
// emergency throttles, configs, admin tokens), their versions and audit
// trail, the store that holds them (a local data directory for one
// instance, etcd for many), and the watch that applies them on every
// instance.
//
// The configuration file stays the base: the control plane's objects are a
// layer over it (see policy.Layer). A rule written through the control
// plane with the id of a file rule replaces that rule while it exists.
//
// Every object has a version, 1 when created and one more at each change;
// a write that names a version (ifVersion > 0) fails with a *ConflictError
// unless it is the current one. Every change is written with its audit
// entry in one transaction.
package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Roles of admin tokens, each allowed what the one before it is.
const (
	RoleViewer   = "viewer"   // reads
	RoleOperator = "operator" // and overrides, tiers of identities, throttles
	RoleAdmin    = "admin"    // and rules, configs, tokens
)

// Actor is who makes a change: an admin token's name and role.
type Actor struct {
	Name string `json:"name"`
	Role string `json:"role"`
}

// Rule is a rule written through the control plane. Spec is the rule as one
// object of the configuration file's `rules:` list, in JSON, with the same
// field names (id, match, dimension, algorithm, limit, window, ...).
type Rule struct {
	ID        string          `json:"id"`
	Spec      json.RawMessage `json:"spec"`
	Version   int64           `json:"version"`
	UpdatedAt time.Time       `json:"updated_at"`
	UpdatedBy string          `json:"updated_by,omitempty"`
}

// Identity is the tier given to one identity.
type Identity struct {
	// Kind is "user", "client" or "api_key".
	Kind      string    `json:"kind"`
	Value     string    `json:"value"`
	Tier      string    `json:"tier"`
	Version   int64     `json:"version"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by,omitempty"`
}

// LimitSpec is a limit as the configuration file writes one; fields left
// out come from the limit the rule would otherwise apply.
type LimitSpec struct {
	Algorithm string `json:"algorithm,omitempty"`
	Limit     int64  `json:"limit,omitempty"`
	Window    string `json:"window,omitempty"` // a Go duration: "1m", "1h"
	Burst     int64  `json:"burst,omitempty"`
}

// Override is a temporary limit for one identity on some rules.
type Override struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"` // "user", "client" or "api_key"
	Value string `json:"value"`
	// Limits are by rule id.
	Limits    map[string]LimitSpec `json:"limits"`
	ExpiresAt time.Time            `json:"expires_at"`
	Reason    string               `json:"reason"`
	Version   int64                `json:"version"`
	CreatedAt time.Time            `json:"created_at"`
	CreatedBy string               `json:"created_by,omitempty"`
}

// Scopes of an emergency throttle.
const (
	ScopeGlobal = "global" // every instance of every region
	ScopeRegion = "region" // the instances of one region (Target)
	ScopeClient = "client" // one client id (Target), everywhere
)

// Throttle is an emergency throttle: it cuts the effective limits in its
// scope by ReductionPercent until ExpiresAt, or until lifted.
type Throttle struct {
	ID               string    `json:"id"`
	Scope            string    `json:"scope"`
	Target           string    `json:"target,omitempty"`
	ReductionPercent float64   `json:"reduction_percent"`
	ExpiresAt        time.Time `json:"expires_at"`
	// Duration, when ExpiresAt is zero, makes PutThrottle set ExpiresAt to
	// now plus Duration; it is not stored.
	Duration  time.Duration `json:"-"`
	Reason    string        `json:"reason"`
	Version   int64         `json:"version"`
	CreatedAt time.Time     `json:"created_at"`
	CreatedBy string        `json:"created_by,omitempty"`
}

// Config is a limit configuration in the shape of the configs API: one
// client's limit on one resource. It becomes a rule (id "config-<id>")
// matching Resource for ClientID.
type Config struct {
	ID              string             `json:"id"`
	ClientID        string             `json:"client_id"`
	Resource        string             `json:"resource"`
	Algorithm       string             `json:"algorithm"`
	BaseRate        int64              `json:"base_rate"`      // per second
	BurstCapacity   int64              `json:"burst_capacity"` // optional
	GlobalLimit     int64              `json:"global_limit,omitempty"`
	CostMultipliers map[string]float64 `json:"cost_multipliers,omitempty"`
	Priority        int                `json:"priority,omitempty"`
	AdaptiveConfig  json.RawMessage    `json:"adaptive_config,omitempty"`
	Version         int64              `json:"version"`
	UpdatedAt       time.Time          `json:"updated_at"`
	UpdatedBy       string             `json:"updated_by,omitempty"`
}

// Token is an admin token: only the SHA-256 of its secret is kept.
type Token struct {
	Name   string `json:"name"`
	Role   string `json:"role"`
	SHA256 string `json:"sha256"` // hex
}

// AuditEntry records one change.
type AuditEntry struct {
	// Revision is the store revision of the change; entries are ordered by it.
	Revision int64     `json:"revision"`
	Time     time.Time `json:"time"`
	Actor    Actor     `json:"actor"`
	// Action is "create", "update", "delete", "rollback" or "lift".
	Action string `json:"action"`
	// Object is the kind ("rule", "identity", "override", "throttle",
	// "config", "token") and ID its id.
	Object  string          `json:"object"`
	ID      string          `json:"id"`
	Before  json.RawMessage `json:"before,omitempty"`
	After   json.RawMessage `json:"after,omitempty"`
	Reason  string          `json:"reason,omitempty"`
	Version int64           `json:"version"`
}

// Errors of the control plane; the admin API maps each to a status.
var (
	// ErrNotFound: no object with that id (404).
	ErrNotFound = errors.New("not found")
	// ErrUnavailable: the configuration store cannot be reached; nothing
	// was written (503).
	ErrUnavailable = errors.New("configuration store unavailable")
)

// ConflictError is returned for a write that named a version other than the
// object's current one (409); nothing was written.
type ConflictError struct {
	Object  string
	ID      string
	Current int64 // 0 when the object does not exist
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s %q is at version %d", e.Object, e.ID, e.Current)
}

// FieldError is bad input (400): Field names it as the JSON body does
// ("reduction_percent", "limits.api.window").
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }
