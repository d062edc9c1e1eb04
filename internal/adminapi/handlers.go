package adminapi

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/control"
)

// identityKinds maps the URL's kinds to the control plane's.
var identityKinds = map[string]string{"users": "user", "clients": "client", "api-keys": "api_key"}

// identity returns the kind and value of an identity route, or errNoRoute.
func identity(r *http.Request) (kind, value string, err error) {
	kind, ok := identityKinds[r.PathValue("kind")]
	if !ok {
		return "", "", errNoRoute
	}
	return kind, r.PathValue("id"), nil
}

// reasonOf returns the reason of a request without a body: the query's
// reason.
func reasonOf(r *http.Request) string { return r.URL.Query().Get("reason") }

func (h *Handler) listRules(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	rules, err := h.plane.Rules(r.Context())
	if err != nil {
		return err
	}
	out := make([]map[string]any, 0, len(rules))
	for _, ru := range rules {
		out = append(out, ruleOut(ru))
	}
	writeJSON(w, http.StatusOK, map[string]any{"rules": out})
	return nil
}

func (h *Handler) getRule(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	ru, err := h.plane.Rule(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(ru.Version, 10)))
	writeJSON(w, http.StatusOK, ruleOut(ru))
	return nil
}

func (h *Handler) postRule(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	return h.writeRule(w, r, a, "")
}

func (h *Handler) putRule(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	return h.writeRule(w, r, a, r.PathValue("id"))
}

// writeRule creates or replaces a rule: POST (pathID "") refuses an
// existing id with 409, PUT creates or replaces.
func (h *Handler) writeRule(w http.ResponseWriter, r *http.Request, a control.Actor, pathID string) error {
	data, err := readBody(r)
	if err != nil {
		return err
	}
	ru, reason, err := decodeRule(data, pathID)
	if err != nil {
		return err
	}
	ver, err := ifVersion(r, ru.Version)
	if err != nil {
		return err
	}
	if pathID == "" && ver == 0 {
		// POST creates: an existing rule is a conflict.
		if cur, err := h.plane.Rule(r.Context(), ru.ID); err == nil {
			return &control.ConflictError{Object: "rule", ID: ru.ID, Current: cur.Version}
		} else if !errors.Is(err, control.ErrNotFound) {
			return err
		}
	}
	ru.Version = 0
	got, created, err := h.plane.PutRule(r.Context(), a, ru, ver, reason)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(got.Version, 10)))
	writeJSON(w, status, ruleOut(got))
	return nil
}

func (h *Handler) deleteRule(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	ver, err := ifVersion(r, 0)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := h.plane.DeleteRule(r.Context(), a, id, ver, reasonOf(r)); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "deleted", "id": id})
	return nil
}

// limitsResponse is the body of GET /api/v1/{kind}/{id}/limits.
type limitsResponse struct {
	Kind        string             `json:"kind"`
	Value       string             `json:"value"`
	Tier        string             `json:"tier,omitempty"`
	TierVersion int64              `json:"tier_version"`
	Limits      any                `json:"limits,omitempty"`
	Overrides   []control.Override `json:"overrides"`
}

func (h *Handler) getLimits(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	kind, value, err := identity(r)
	if err != nil {
		return err
	}
	out := limitsResponse{Kind: kind, Value: value}
	id, err := h.plane.Identity(r.Context(), kind, value)
	switch {
	case err == nil:
		out.Tier, out.TierVersion = id.Tier, id.Version
	case !errors.Is(err, control.ErrNotFound):
		return err
	}
	if out.Overrides, err = h.activeOverrides(r, kind, value); err != nil {
		return err
	}
	if h.limits != nil {
		out.Limits = h.limits(kind, value)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// activeOverrides returns the overrides of an identity not yet expired.
func (h *Handler) activeOverrides(r *http.Request, kind, value string) ([]control.Override, error) {
	all, err := h.plane.Overrides(r.Context(), kind, value)
	if err != nil {
		return nil, err
	}
	now := h.now()
	out := make([]control.Override, 0, len(all))
	for _, o := range all {
		if o.ExpiresAt.After(now) {
			out = append(out, o)
		}
	}
	return out, nil
}

func (h *Handler) listOverrides(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	kind, value, err := identity(r)
	if err != nil {
		return err
	}
	os, err := h.activeOverrides(r, kind, value)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"overrides": os})
	return nil
}

// tierRequest is the body of PUT /api/v1/{kind}/{id}/tier.
type tierRequest struct {
	Tier    string `json:"tier"`
	Version int64  `json:"version"`
	Reason  string `json:"reason"`
}

func (h *Handler) putTier(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	kind, value, err := identity(r)
	if err != nil {
		return err
	}
	data, err := readBody(r)
	if err != nil {
		return err
	}
	var req tierRequest
	if err := decodeStrict(data, &req); err != nil {
		return err
	}
	if strings.TrimSpace(req.Tier) == "" {
		return fieldErr("tier", "required")
	}
	ver, err := ifVersion(r, req.Version)
	if err != nil {
		return err
	}
	got, err := h.plane.SetTier(r.Context(), a, control.Identity{Kind: kind, Value: value, Tier: req.Tier}, ver, req.Reason)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, got)
	return nil
}

func (h *Handler) postOverride(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	kind, value, err := identity(r)
	if err != nil {
		return err
	}
	data, err := readBody(r)
	if err != nil {
		return err
	}
	o, err := decodeOverride(data, kind, value, h.now())
	if err != nil {
		return err
	}
	got, err := h.plane.PutOverride(r.Context(), a, o)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, got)
	return nil
}

func (h *Handler) deleteOverride(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	if _, _, err := identity(r); err != nil {
		return err
	}
	ver, err := ifVersion(r, 0)
	if err != nil {
		return err
	}
	id := r.PathValue("override_id")
	if err := h.plane.DeleteOverride(r.Context(), a, id, ver, reasonOf(r)); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "deleted", "id": id})
	return nil
}

func (h *Handler) listThrottles(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	ts, err := h.plane.Throttles(r.Context())
	if err != nil {
		return err
	}
	if ts == nil {
		ts = []control.Throttle{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"throttles": ts})
	return nil
}

// throttleResponse is the body of POST /api/v1/emergency/throttle.
type throttleResponse struct {
	Status string `json:"status"`
	control.Throttle
}

func (h *Handler) postThrottle(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	data, err := readBody(r)
	if err != nil {
		return err
	}
	t, err := decodeThrottle(data, h.now())
	if err != nil {
		return err
	}
	got, err := h.plane.PutThrottle(r.Context(), a, t)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, throttleResponse{"applied", got})
	return nil
}

func (h *Handler) liftThrottle(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	got, err := h.plane.LiftThrottle(r.Context(), a, r.PathValue("id"), reasonOf(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, throttleResponse{"lifted", got})
	return nil
}

func (h *Handler) getConfig(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	st, err := h.plane.Config(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (h *Handler) configVersions(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	vs, err := h.plane.ConfigVersions(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"versions": vs})
	return nil
}

func (h *Handler) postConfig(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	data, err := readBody(r)
	if err != nil {
		return err
	}
	c, err := decodeConfig(data)
	if err != nil {
		return err
	}
	ver, err := ifVersion(r, c.Version)
	if err != nil {
		return err
	}
	c.Version = 0
	got, created, err := h.plane.PutConfig(r.Context(), a, c, ver)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return h.writeConfigState(w, r, status, got)
}

// writeConfigState answers the state of the config c just written: its
// propagation status with it.
func (h *Handler) writeConfigState(w http.ResponseWriter, r *http.Request, status int, c control.Config) error {
	st, err := h.plane.Config(r.Context(), c.ID)
	if err != nil {
		// Written, but its state cannot be read now: still pending.
		writeJSON(w, status, control.ConfigState{Config: c, PropagationStatus: "pending"})
		return nil
	}
	writeJSON(w, status, st)
	return nil
}

// rollbackRequest is the body of POST /api/v1/configs/{id}/rollback.
type rollbackRequest struct {
	Version int64  `json:"version"`
	Reason  string `json:"reason"`
}

func (h *Handler) rollbackConfig(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	data, err := readBody(r)
	if err != nil {
		return err
	}
	var req rollbackRequest
	if err := decodeStrict(data, &req); err != nil {
		return err
	}
	if req.Version <= 0 {
		return fieldErr("version", "required: the version to roll back to, 1 or more")
	}
	got, err := h.plane.RollbackConfig(r.Context(), a, r.PathValue("id"), req.Version, req.Reason)
	if err != nil {
		return err
	}
	return h.writeConfigState(w, r, http.StatusOK, got)
}

// tokenInfo is a token as listed: never its hash.
type tokenInfo struct {
	Name string `json:"name"`
	Role string `json:"role"`
}

func (h *Handler) listTokens(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	ts, err := h.plane.Tokens(r.Context())
	if err != nil {
		return err
	}
	out := make([]tokenInfo, 0, len(ts))
	for _, t := range ts {
		out = append(out, tokenInfo{t.Name, t.Role})
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out})
	return nil
}

// newToken is the answer to POST /api/v1/tokens: the token, shown once.
type newToken struct {
	Name   string `json:"name"`
	Role   string `json:"role"`
	Token  string `json:"token"`
	SHA256 string `json:"sha256"`
}

func (h *Handler) postToken(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	data, err := readBody(r)
	if err != nil {
		return err
	}
	var req tokenInfo
	if err := decodeStrict(data, &req); err != nil {
		return err
	}
	tok, sum, err := auth.Generate()
	if err != nil {
		return err
	}
	t := control.Token{Name: req.Name, Role: req.Role, SHA256: sum}
	if err := auth.ValidateToken(t); err != nil {
		return err
	}
	if err := h.plane.PutToken(r.Context(), a, t); err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, newToken{t.Name, t.Role, tok, sum})
	return nil
}

func (h *Handler) deleteToken(w http.ResponseWriter, r *http.Request, a control.Actor) error {
	name := r.PathValue("name")
	if err := h.plane.DeleteToken(r.Context(), a, name, reasonOf(r)); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "deleted", "name": name})
	return nil
}

// MaxAuditLimit is the most audit entries one request returns.
const MaxAuditLimit = 1000

func (h *Handler) listAudit(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	q := r.URL.Query()
	f := control.AuditFilter{Object: q.Get("object"), ID: q.Get("id"), Actor: q.Get("actor"), Limit: 100}
	if s := q.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return fieldErr("since", "want an RFC 3339 time such as 2026-01-02T15:04:05Z")
		}
		f.Since = t
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxAuditLimit {
			return fieldErr("limit", "want 1 to %d", MaxAuditLimit)
		}
		f.Limit = n
	}
	es, err := h.plane.Audit(r.Context(), f)
	if err != nil {
		return err
	}
	if es == nil {
		es = []control.AuditEntry{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": es})
	return nil
}

func (h *Handler) controlStatus(w http.ResponseWriter, r *http.Request, _ control.Actor) error {
	writeJSON(w, http.StatusOK, h.plane.Status())
	return nil
}
