package httpapi

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/reserve"
	"github.com/sluicehq/sluice/reservation"
)

// errNoHistory is the analytics store failing to answer for a client's
// history: the limits are still there, the history is not.
var errNoHistory = errors.New("httpapi: the client's history cannot be read")

// errorStatuses maps errors to HTTP statuses and the error codes of the JSON
// error body, in one table; the first entry the error matches with
// errors.Is wins. Anything else is a 500 internal_error.
var errorStatuses = []struct {
	err    error
	status int
	code   string
}{
	{errTooLarge, http.StatusRequestEntityTooLarge, "request_too_large"},
	{errNoHistory, http.StatusServiceUnavailable, "unavailable"},
	{engine.ErrInvalidCheck, http.StatusBadRequest, "invalid_request"},
	{sluice.ErrInvalidCost, http.StatusBadRequest, "invalid_request"},
	{sluice.ErrStoreUnavailable, http.StatusServiceUnavailable, "unavailable"},
	{context.DeadlineExceeded, http.StatusServiceUnavailable, "unavailable"},
	{context.Canceled, http.StatusServiceUnavailable, "unavailable"},
	{reservation.ErrInvalid, http.StatusBadRequest, "invalid_request"},
	{reservation.ErrQueueFull, http.StatusTooManyRequests, "queue_full"},
	{reservation.ErrNotFound, http.StatusNotFound, "reservation_not_found"},
	{reserve.ErrForbidden, http.StatusForbidden, "forbidden"},
	{reserve.ErrDenyListed, http.StatusForbidden, "forbidden"},
}

// statusOf returns the HTTP status and error code for err.
func statusOf(err error) (int, string) {
	for _, e := range errorStatuses {
		if errors.Is(err, e.err) {
			return e.status, e.code
		}
	}
	return http.StatusInternalServerError, "internal_error"
}

// decisionStatus returns the HTTP status of a decided check: 200 allowed,
// 429 denied, 503 denied because the store failed and the rule fails closed.
func decisionStatus(r *engine.Result) int {
	switch {
	case r.Allowed:
		return http.StatusOK
	case r.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusTooManyRequests
}

// writeError answers err with its status and the JSON error body.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, code := statusOf(err)
	b := getBuf()
	defer putBuf(b)
	b.b = append(b.b, `{"error":`...)
	b.b = appendString(b.b, code)
	var fe *engine.FieldError
	desc := err.Error()
	switch {
	case errors.As(err, &fe):
		b.b = append(b.b, `,"field":`...)
		b.b = appendString(b.b, fe.Field)
		desc = fe.Field + ": " + fe.Reason
	case errors.Is(err, errTooLarge):
		b.b = append(b.b, `,"field":"body"`...)
		desc = "the request body is larger than " + strconv.Itoa(MaxBodyBytes) + " bytes"
	}
	if status >= 500 {
		h.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
		if status == http.StatusInternalServerError {
			desc = "internal error"
		}
	}
	b.b = append(b.b, `,"error_description":`...)
	b.b = appendString(b.b, desc)
	b.b = append(b.b, '}')
	writeJSON(w, status, b.b)
}

func (h *Handler) handleCheck(w http.ResponseWriter, r *http.Request) {
	b := getBuf()
	defer putBuf(b)
	if err := readBody(r, b); err != nil {
		h.writeError(w, r, err)
		return
	}
	var c engine.Check
	resID, err := decodeCheck(b.b, &c)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if resID != "" && h.checkReserved(w, r, &c, resID) {
		return
	}
	if c.IdempotencyKey == "" {
		if k := r.Header.Get("X-Idempotency-Key"); k != "" {
			if err := engine.ValidateField("idempotency_key", k); err != nil {
				h.writeError(w, r, err)
				return
			}
			c.IdempotencyKey = k
		}
	}
	start := time.Now()
	res, err := h.eng.Check(r.Context(), &c)
	latency := ceilMicros(time.Since(start))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	now := h.now()
	status := decisionStatus(&res)
	setHeaders(w.Header(), &res, now, latency, h.noOps)
	b.b = appendResult(b.b[:0], &res, status, now, "", latency)
	if status == http.StatusTooManyRequests {
		b.b = h.appendQueued(b.b, &c, now)
	}
	writeJSON(w, status, b.b)
}

func (h *Handler) handleBatch(w http.ResponseWriter, r *http.Request) {
	m := getBatchMem()
	defer putBatchMem(m)
	b := &m.body
	if err := readBody(r, b); err != nil {
		h.writeError(w, r, err)
		return
	}
	h.eng.Begin(r.Context(), bytes.Count(b.b, []byte{'{'})-1, &m.answer) // decoded and answered in turn
	defer m.answer.End()
	checks, mode, err := decodeBatch(b.b, m)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := h.eng.BatchCheckInto(r.Context(), checks, mode, &m.answer); err != nil {
		h.writeError(w, r, err)
		return
	}
	results := m.answer.Results
	if len(results) != len(checks) {
		h.writeError(w, r, errors.New("httpapi: the engine returned a result count unlike the check count"))
		return
	}
	now := h.now()
	allowed, denied, unavailable := 0, 0, 0
	for i := range results {
		switch decisionStatus(&results[i]) {
		case http.StatusOK:
			allowed++
		case http.StatusServiceUnavailable:
			unavailable++
		default:
			denied++
		}
	}
	status := http.StatusOK
	switch {
	case allowed == len(results):
	case mode == engine.BestEffort:
		status = http.StatusMultiStatus
	case unavailable > 0:
		status = http.StatusServiceUnavailable
	default:
		status = http.StatusTooManyRequests
	}
	b.b = append(b.b[:0], `{"allowed":`...)
	b.b = strconv.AppendBool(b.b, allowed == len(results))
	b.b = append(b.b, `,"partial":`...)
	b.b = strconv.AppendBool(b.b, allowed > 0 && allowed < len(results))
	b.b = append(b.b, `,"mode":`...)
	if mode == engine.BestEffort {
		b.b = append(b.b, `"best_effort"`...)
	} else {
		b.b = append(b.b, `"all_or_nothing"`...)
	}
	b.b = append(b.b, `,"results":[`...)
	for i := range results {
		if i > 0 {
			b.b = append(b.b, ',')
		}
		b.b = appendResult(b.b, &results[i], decisionStatus(&results[i]), now, checks[i].Resource, -1)
	}
	b.b = append(b.b, "]}"...)
	writeJSON(w, status, b.b)
}

func (h *Handler) handleStatus(w http.ResponseWriter, r *http.Request) {
	cr := checkRequest{ClientID: r.PathValue("client_id")}
	history, err := cr.parseStatusQuery(r.URL.RawQuery)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if history && h.history == nil {
		h.writeError(w, r, fieldErr("include_history", "not served: this instance records no analytics (it runs with --no-analytics)"))
		return
	}
	zero := int64(0)
	cr.Cost = &zero
	var c engine.Check
	if err := cr.validCheck(&c); err != nil {
		h.writeError(w, r, err)
		return
	}
	rules, err := h.eng.Status(r.Context(), &c)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	now := h.now()
	b := getBuf()
	defer putBuf(b)
	b.b = append(b.b, `{"client_id":`...)
	b.b = appendString(b.b, c.ClientID)
	b.b = append(b.b, `,"limits":[`...)
	for i := range rules {
		if i > 0 {
			b.b = append(b.b, ',')
		}
		b.b = appendRule(b.b, &rules[i], now)
	}
	b.b = append(b.b, ']')
	if history {
		hi, err := h.history(r.Context(), c.ClientID, now)
		if err != nil {
			// The cause is logged, not answered: it may name the
			// database's host and user.
			h.log.ErrorContext(r.Context(), "reading a client's history", "err", err)
			h.writeError(w, r, errNoHistory)
			return
		}
		b.b = append(b.b, `,"last_24h_requests":`...)
		b.b = strconv.AppendInt(b.b, hi.Requests, 10)
		b.b = append(b.b, `,"last_24h_blocked":`...)
		b.b = strconv.AppendInt(b.b, hi.Blocked, 10)
		b.b = append(b.b, `,"average_latency_us":`...)
		b.b = strconv.AppendFloat(b.b, hi.AvgLatencyUS, 'f', 1, 64)
	}
	b.b = append(b.b, '}')
	writeJSON(w, http.StatusOK, b.b)
}

// usageState returns the usage state of a rule: "throttled" when denied,
// "warning" when more than 80% of the limit is used, "normal" otherwise.
func usageState(allowed bool, limit, remaining int64) string {
	switch {
	case !allowed:
		return "throttled"
	case limit > 0 && (limit-remaining)*5 > limit*4:
		return "warning"
	}
	return "normal"
}

// ceilSeconds returns d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// resetAt returns the Unix second at which a limit reset after d from now
// is fully restored, rounded up.
func resetAt(now time.Time, d time.Duration) int64 {
	t := now.Add(d)
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// deniedWithBatch reports a check denied only because another check of its
// all_or_nothing batch was: every one of its enforcing rules allowed it, or
// another check's identity is deny-listed (the engine then reports the
// check with source deny_list and no rules, while a deny-listed check has
// the deny_list rule).
func deniedWithBatch(res *engine.Result) bool {
	switch {
	case res.Allowed:
		return false
	case res.Source == engine.SourceDenyList:
		return len(res.Rules) == 0
	case len(res.Rules) == 0:
		// No rule applies to it: nothing else could deny it.
		return true
	}
	for i := range res.Rules {
		if !res.Rules[i].Allowed && !res.Rules[i].Shadow {
			return false
		}
	}
	return true
}

// setHeaders sets the rate-limit headers of a check's answer; latencyUS is
// the time the engine took to decide it, in microseconds. With noOps, the
// headers meant for operators are left out and the IETF headers name the
// policy "limit" instead of the rule (see Config.NoOperatorHeaders). The values share
// one backing array, so that an answer costs one allocation for them rather
// than one per header.
func setHeaders(hdr http.Header, res *engine.Result, now time.Time, latencyUS int64, noOps bool) {
	d := &res.Deciding
	vals := make([]string, 0, 15)
	one := func(v string) []string {
		vals = append(vals, v)
		n := len(vals)
		return vals[n-1 : n : n]
	}
	var nb [64]byte
	num := func(v int64) []string { return one(string(strconv.AppendInt(nb[:0], v, 10))) }
	if !noOps {
		hdr["X-Ratelimit-Decision-Source"] = one(res.Source.String())
		if res.Fallback != engine.FallbackNone {
			hdr["X-Ratelimit-Fallback-Reason"] = one(res.Fallback.String())
		}
		hdr["X-Ratelimit-Decision-Latency-Us"] = num(latencyUS)
	}
	if res.ThrottlePercent > 0 && !noOps {
		hdr["X-Ratelimit-Throttle"] = one(string(strconv.AppendFloat(nb[:0], res.ThrottlePercent, 'f', -1, 64)))
	}
	if d.Rule == "" || res.Source == engine.SourceAllowList {
		// No limit applies: a quota of 0 with 0 remaining would tell a
		// client that honours these headers to stop.
		return
	}
	hdr["X-Ratelimit-Limit"] = num(d.Limit)
	hdr["X-Ratelimit-Remaining"] = num(d.Remaining)
	hdr["X-Ratelimit-Reset"] = num(resetAt(now, d.ResetAfter))
	if !noOps {
		hdr["X-Ratelimit-Policy"] = one(d.Rule)
	}
	if g, ok := res.GlobalRemaining(); ok {
		hdr["X-Ratelimit-Global-Remaining"] = num(g)
	}
	if t := res.CallerTier(); t != "" && !noOps {
		hdr["X-Ratelimit-Tier"] = one(t)
	}
	state := usageState(res.Allowed, d.Limit, d.Remaining)
	hdr["X-Ratelimit-State"] = one(state)
	if state == "warning" {
		used := (d.Limit - d.Remaining) * 100 / d.Limit
		hdr["X-Ratelimit-Warning"] = one(strconv.FormatInt(used, 10) + "% of the limit used")
	}
	if res.ShadowDenied && !noOps {
		hdr["X-Ratelimit-Shadow-Denied"] = one("true")
	}
	// IETF draft-ietf-httpapi-ratelimit-headers: structured-field items
	// naming the policy, with its quota and the remaining quota and reset.
	name := `"limit"`
	if !noOps {
		name = sfString(d.Rule)
	}
	b := append(append(nb[:0], name...), ";q="...)
	hdr["Ratelimit-Policy"] = one(string(strconv.AppendInt(b, d.Limit, 10)))
	b = append(append(nb[:0], name...), ";r="...)
	b = append(strconv.AppendInt(b, d.Remaining, 10), ";t="...)
	hdr["Ratelimit"] = one(string(strconv.AppendInt(b, ceilSeconds(d.ResetAfter), 10)))
	if !res.Allowed && d.RetryAfter > 0 {
		hdr["Retry-After"] = num(ceilSeconds(d.RetryAfter))
		hdr["Retry-After-Ms"] = num(ceilMillis(d.RetryAfter))
	}
}

// ceilMicros returns d in whole microseconds, rounded up.
func ceilMicros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// sfString returns s as an RFC 8941 structured-field string: printable ASCII
// in quotes, with '"' and '\' escaped; other bytes are dropped.
func sfString(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c >= 0x20 && c < 0x7f:
			b = append(b, c)
		}
	}
	return string(append(b, '"'))
}

// appendResult appends the JSON body of a check's answer; resource, when
// set, is echoed (batch items), and latencyUS, the engine's time to decide
// in microseconds, is written when it is not negative (single checks).
func appendResult(b []byte, res *engine.Result, status int, now time.Time, resource string, latencyUS int64) []byte {
	d := &res.Deciding
	b = append(b, '{')
	if resource != "" {
		b = append(b, `"resource":`...)
		b = appendString(b, resource)
		b = append(b, ',')
	}
	b = append(b, `"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, res.Allowed)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, `,"reset_at":`...)
	b = strconv.AppendInt(b, resetAt(now, d.ResetAfter), 10)
	retry := d.RetryAfter
	if res.Allowed {
		retry = 0
	}
	b = append(b, `,"retry_after":`...)
	b = strconv.AppendInt(b, ceilSeconds(retry), 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, ceilMillis(retry), 10)
	b = append(b, `,"rule":`...)
	b = appendString(b, d.Rule)
	b = append(b, `,"tier":`...)
	b = appendString(b, res.CallerTier())
	b = append(b, `,"source":`...)
	b = appendString(b, res.Source.String())
	if res.Fallback != engine.FallbackNone {
		b = append(b, `,"fallback_reason":`...)
		b = appendString(b, res.Fallback.String())
	}
	b = append(b, `,"cost":`...)
	b = strconv.AppendInt(b, d.Cost, 10)
	b = append(b, `,"state":`...)
	b = appendString(b, usageState(res.Allowed, d.Limit, d.Remaining))
	b = append(b, `,"shadow_denied":`...)
	b = strconv.AppendBool(b, res.ShadowDenied)
	b = appendThrottle(b, res.ThrottlePercent)
	if g, ok := res.GlobalRemaining(); ok {
		b = append(b, `,"global_remaining":`...)
		b = strconv.AppendInt(b, g, 10)
	}
	if latencyUS >= 0 {
		b = append(b, `,"latency_us":`...)
		b = strconv.AppendInt(b, latencyUS, 10)
	}
	switch status {
	case http.StatusTooManyRequests:
		if d.Global && !deniedWithBatch(res) {
			b = append(b, `,"error":"global_limit_exceeded","error_description":`...)
		} else {
			b = append(b, `,"error":"rate_limit_exceeded","error_description":`...)
		}
		var desc []byte
		switch {
		case deniedWithBatch(res):
			desc = append(desc, "Another check of this all_or_nothing batch was denied, so none was admitted and nothing was consumed."...)
		case res.Source == engine.SourceDenyList:
			desc = append(desc, "The caller is on a deny list."...)
		case retry > 0:
			desc = append(desc, "Too many requests. Please retry after "...)
			desc = strconv.AppendInt(desc, ceilSeconds(retry), 10)
			desc = append(desc, " seconds."...)
		default:
			desc = append(desc, "The request costs more than the limit allows; it can never be admitted."...)
		}
		b = appendString(b, string(desc))
	case http.StatusServiceUnavailable:
		b = append(b, `,"error":"unavailable","error_description":"The rate limit store cannot answer and the rule fails closed."`...)
	}
	b = append(b, `,"rules":[`...)
	for i := range res.Rules {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendRule(b, &res.Rules[i], now)
	}
	return append(b, "]}"...)
}

// appendRule appends the JSON object of one rule's outcome or state.
func appendRule(b []byte, r *engine.RuleResult, now time.Time) []byte {
	b = append(b, `{"rule":`...)
	b = appendString(b, r.Rule)
	b = append(b, `,"tier":`...)
	b = appendString(b, r.Tier)
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, r.Allowed)
	b = append(b, `,"shadow":`...)
	b = strconv.AppendBool(b, r.Shadow)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, r.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, r.Remaining, 10)
	b = append(b, `,"reset_at":`...)
	b = strconv.AppendInt(b, resetAt(now, r.ResetAfter), 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, ceilMillis(r.RetryAfter), 10)
	b = append(b, `,"cost":`...)
	b = strconv.AppendInt(b, r.Cost, 10)
	b = append(b, `,"source":`...)
	b = appendString(b, r.Source.String())
	if r.Fallback != engine.FallbackNone {
		b = append(b, `,"fallback_reason":`...)
		b = appendString(b, r.Fallback.String())
	}
	b = appendThrottle(b, r.ThrottlePercent)
	if r.Global {
		b = append(b, `,"global":true`...)
	}
	return append(b, '}')
}

// appendThrottle appends the "throttle_percent" member, when a throttle
// cut the limits (pct above 0).
func appendThrottle(b []byte, pct float64) []byte {
	if pct <= 0 {
		return b
	}
	b = append(b, `,"throttle_percent":`...)
	return strconv.AppendFloat(b, pct, 'f', -1, 64)
}

// appendConfigStatus appends s as JSON.
func appendConfigStatus(b []byte, s ConfigStatus) []byte {
	b = append(b, `{"version":`...)
	b = appendString(b, s.Version)
	if s.Path != "" {
		b = append(b, `,"path":`...)
		b = appendString(b, s.Path)
	}
	b = append(b, `,"loaded_at":`...)
	b = appendString(b, s.LoadedAt.UTC().Format(time.RFC3339Nano))
	b = append(b, `,"reloads":`...)
	b = strconv.AppendInt(b, s.Reloads, 10)
	if s.LastError != "" {
		b = append(b, `,"last_error":`...)
		b = appendString(b, s.LastError)
	}
	if s.LastErrorAt != nil {
		b = append(b, `,"last_error_at":`...)
		b = appendString(b, s.LastErrorAt.UTC().Format(time.RFC3339Nano))
	}
	return append(b, '}')
}

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0x80 {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == '\u2028' || r == '\u2029' {
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		} else if r == utf8.RuneError && size == 1 {
			b = append(b, "\ufffd"...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
