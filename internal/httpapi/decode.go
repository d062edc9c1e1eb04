package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/jsonpath"
)

// errTooLarge reports a request body over MaxBodyBytes (HTTP 413).
var errTooLarge = errors.New("httpapi: request body too large")

// fieldErr returns the error for a bad value in field: it wraps
// engine.ErrInvalidCheck, like the engine's own validation errors.
func fieldErr(field, format string, args ...any) error {
	return &engine.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// checkRequest is the JSON body of POST /api/v1/check and one item of a
// batch.
type checkRequest struct {
	ClientID       string `json:"client_id"`
	Resource       string `json:"resource"`
	Operation      string `json:"operation"`
	Cost           *int64 `json:"cost"`
	Priority       string `json:"priority"`
	IdempotencyKey string `json:"idempotency_key"`
	User           string `json:"user"`
	IP             string `json:"ip"`
	APIKey         string `json:"api_key"`
	Method         string `json:"method"`
	// ReservationID draws the check from a reservation (single checks
	// only; see handleCheck).
	ReservationID string `json:"reservation_id"`
}

// batchRequest is the JSON body of POST /api/v1/batch-check.
type batchRequest struct {
	ClientID string         `json:"client_id"`
	User     string         `json:"user"`
	IP       string         `json:"ip"`
	APIKey   string         `json:"api_key"`
	Priority string         `json:"priority"`
	Mode     string         `json:"mode"`
	Checks   []checkRequest `json:"checks"`
}

// buf is a pooled byte buffer for request and response bodies.
type buf struct{ b []byte }

var bufPool = sync.Pool{New: func() any { return &buf{b: make([]byte, 0, 1024)} }}

func getBuf() *buf { b := bufPool.Get().(*buf); b.b = b.b[:0]; return b }

func putBuf(b *buf) {
	if cap(b.b) <= 16<<10 {
		bufPool.Put(b)
	}
}

// readBody reads r's body into b, refusing more than MaxBodyBytes.
func readBody(r *http.Request, b *buf) error {
	if r.ContentLength > MaxBodyBytes {
		return errTooLarge
	}
	lr := io.LimitReader(r.Body, MaxBodyBytes+1)
	for {
		if len(b.b) == cap(b.b) {
			b.b = append(b.b, 0)[:len(b.b)]
		}
		n, err := lr.Read(b.b[len(b.b):cap(b.b)])
		b.b = b.b[:len(b.b)+n]
		if len(b.b) > MaxBodyBytes {
			return errTooLarge
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fieldErr("body", "cannot read the request body: %v", err)
		}
	}
}

// decodeStrict decodes one JSON value from data into v, refusing unknown
// fields, trailing data and invalid UTF-8. Its errors are
// *engine.FieldError naming the field.
func decodeStrict(data []byte, v any) error { return decodeStrictKeys(data, v, keyBit) }

// decodeStrictKeys is decodeStrict for a body whose field names bits
// knows (see keyBit).
func decodeStrictKeys(data []byte, v any, bits func([]byte) uint16) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return fieldErr("body", "empty body; want a JSON object")
	}
	if !utf8.Valid(data) {
		return fieldErr(fieldAtInvalidUTF8(data), "invalid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonFieldErr(data, err, bits)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fieldErr("body", "unexpected data after the JSON object")
	}
	return checkKeys(data, bits)
}

// keyBit returns the bit of a request field name, exactly as spelled in
// checkRequest and batchRequest, and 0 for any other spelling.
func keyBit(name []byte) uint16 {
	switch string(name) {
	case "client_id":
		return 1 << 0
	case "resource":
		return 1 << 1
	case "operation":
		return 1 << 2
	case "cost":
		return 1 << 3
	case "priority":
		return 1 << 4
	case "idempotency_key":
		return 1 << 5
	case "user":
		return 1 << 6
	case "ip":
		return 1 << 7
	case "api_key":
		return 1 << 8
	case "method":
		return 1 << 9
	case "mode":
		return 1 << 10
	case "checks":
		return 1 << 11
	case "reservation_id":
		return 1 << 12
	}
	return 0
}

// checkKeys refuses, in a JSON document that encoding/json has decoded
// into a request, a null check of a batch, and an object key repeated or
// spelled otherwise than its field: encoding/json takes the last of repeated keys and matches keys
// regardless of case, so {"client_id":"a","client_id":"b"} would be
// decided for b, while a proxy in front may have read a. The error names
// the key's value, such as "checks[1].cost". It runs on documents
// encoding/json accepted, so it only tells strings from the rest.
func checkKeys(data []byte, keyBit func([]byte) uint16) error {
	// frame is one open object (the keys it has had) or array.
	type frame struct {
		obj, wantKey bool
		seen         uint16
	}
	var sbuf [4]frame
	stack := sbuf[:0]
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '{':
			stack = append(stack, frame{obj: true, wantKey: true})
		case '[':
			stack = append(stack, frame{})
		case '}', ']':
			stack = stack[:len(stack)-1]
		case ',':
			if n := len(stack); n > 0 && stack[n-1].obj {
				stack[n-1].wantKey = true
			}
		case 'n':
			// Outside strings, only null holds an 'n'. encoding/json
			// decodes a null check as an empty one, which the batch's
			// fields would then fill: a nil sent by mistake would be
			// charged.
			if n := len(stack); n > 0 && !stack[n-1].obj {
				return fieldErr(jsonpath.FieldAt(data, i), "want a JSON object, got null")
			}
		case '"':
			start, escaped := i+1, false
			for i++; data[i] != '"'; i++ {
				if data[i] == '\\' {
					escaped = true
					i++
				}
			}
			n := len(stack)
			if n == 0 || !stack[n-1].obj || !stack[n-1].wantKey {
				continue
			}
			f := &stack[n-1]
			f.wantKey = false
			name := data[start:i]
			if escaped {
				var s string
				if err := json.Unmarshal(data[start-1:i+1], &s); err != nil {
					return fieldErr("body", "malformed JSON: %v", err)
				}
				name = []byte(s)
			}
			bit := keyBit(name)
			switch {
			case bit == 0:
				return fieldErr(jsonpath.FieldAt(data, valueAfterKey(data, i+1)), "unknown field (names are case-sensitive)")
			case f.seen&bit != 0:
				return fieldErr(jsonpath.FieldAt(data, valueAfterKey(data, i+1)), "given more than once")
			}
			f.seen |= bit
		}
	}
	return nil
}

// valueAfterKey returns the offset of the value of the key that ends just
// before offset i in a well-formed JSON document.
func valueAfterKey(data []byte, i int) int {
	for i < len(data) && (data[i] == ':' || data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// parsePriority maps the wire name of a priority.
func parsePriority(field, s string) (engine.Priority, error) {
	switch s {
	case "", "normal":
		return engine.PriorityNormal, nil
	case "high":
		return engine.PriorityHigh, nil
	case "low":
		return engine.PriorityLow, nil
	}
	return 0, fieldErr(field, "unknown priority %q (want high, normal or low)", truncate(s))
}

// parseMode maps the wire name of a batch mode.
func parseMode(s string) (engine.BatchMode, error) {
	switch s {
	case "", "all_or_nothing":
		return engine.AllOrNothing, nil
	case "best_effort":
		return engine.BestEffort, nil
	}
	return 0, fieldErr("mode", "unknown mode %q (want all_or_nothing or best_effort)", truncate(s))
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// toCheck fills c from cr: the cost (1 when absent) and the priority (by
// its wire name) read, the other fields as they are, unvalidated (see
// engine.Check.Validate). Its errors name the field as in a single check;
// see engine.InBatch for the checks of a batch.
func (cr *checkRequest) toCheck(c *engine.Check) error {
	cost := int64(1)
	if cr.Cost != nil {
		cost = *cr.Cost
	}
	prio, err := parsePriority("priority", cr.Priority)
	if err != nil {
		return err
	}
	*c = engine.Check{
		ClientID:       cr.ClientID,
		User:           cr.User,
		IP:             cr.IP,
		APIKey:         cr.APIKey,
		Resource:       cr.Resource,
		Method:         cr.Method,
		Operation:      cr.Operation,
		Cost:           cost,
		Priority:       prio,
		IdempotencyKey: cr.IdempotencyKey,
	}
	return nil
}

// validCheck fills c from cr (see toCheck) and validates it.
func (cr *checkRequest) validCheck(c *engine.Check) error {
	if err := cr.toCheck(c); err != nil {
		return err
	}
	return c.Validate()
}

// parseStatusQuery fills cr from the query of GET /api/v1/status/{client_id},
// and reports whether it asks for the client's history.
// Unlike url.ParseQuery, which drops what it cannot read, it refuses a
// parameter that is malformed (a bad escape, a ';'), repeated or unknown,
// naming it: answering as if it were absent would report another check's
// rules.
func (cr *checkRequest) parseStatusQuery(raw string) (history bool, err error) {
	var seen uint16
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		rawName, rawVal, _ := strings.Cut(pair, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil {
			return false, fieldErr("query", "parameter name %q: %v", truncate(rawName), err)
		}
		if strings.Contains(pair, ";") {
			return false, fieldErr(truncate(name), "holds a ';', which is not a separator; escape it as %%3B")
		}
		val, err := url.QueryUnescape(rawVal)
		if err != nil {
			return false, fieldErr(name, "%v", err)
		}
		var bit uint16
		var dst *string
		var flag string
		switch name {
		case "resource":
			bit, dst = 1<<0, &cr.Resource
		case "operation":
			bit, dst = 1<<1, &cr.Operation
		case "user":
			bit, dst = 1<<2, &cr.User
		case "ip":
			bit, dst = 1<<3, &cr.IP
		case "api_key":
			bit, dst = 1<<4, &cr.APIKey
		case "method":
			bit, dst = 1<<5, &cr.Method
		// Seed 002's options. The figures are already those of the store
		// every instance shares; predictions and history are not kept.
		case "include_global":
			bit, flag = 1<<6, name
		case "include_predictions":
			bit, flag = 1<<7, name
		case "include_history":
			bit, flag = 1<<8, name
		default:
			return false, fieldErr(truncate(name), "unknown query parameter (want resource, operation, user, ip, api_key, method or include_global)")
		}
		if seen&bit != 0 {
			return false, fieldErr(name, "given more than once")
		}
		seen |= bit
		if flag != "" {
			if err := statusFlag(flag, val); err != nil {
				return false, err
			}
			history = history || flag == "include_history" && val == "true"
			continue
		}
		*dst = val
	}
	return history, nil
}

// statusFlag checks one of the include_* options of the status
// endpoint.
func statusFlag(name, val string) error {
	if val != "true" && val != "false" {
		return fieldErr(name, "want true or false, got %q", truncate(val))
	}
	if val == "true" && name == "include_predictions" {
		return fieldErr(name, "not supported: Sluice keeps no predictions of a client")
	}
	return nil
}

// decodeCheck decodes and validates the body of POST /api/v1/check.
func decodeCheck(data []byte, c *engine.Check) (reservationID string, err error) {
	// encoding/json alone: a decoder of its own for the common bodies
	// saved about 4.5 µs of CPU per check, some 2% of an HTTP check's
	// CPU (client and server), and no checks/s that a same-run
	// measurement could tell from noise (docs/PERFORMANCE.md).
	var cr checkRequest
	if err := decodeStrict(data, &cr); err != nil {
		return "", err
	}
	if err := engine.ValidateField("reservation_id", cr.ReservationID); err != nil {
		return "", err
	}
	return cr.ReservationID, cr.validCheck(c)
}

// batchMem is the memory of one batch request, pooled: its body, the body
// decoded, its checks, and the engine's answer. For a batch of 1,000
// checks they take about a megabyte, which would otherwise be garbage
// after each batch, and the garbage collections it causes slow every
// other request of the process.
type batchMem struct {
	body   buf
	br     batchRequest
	checks []engine.Check
	answer engine.BatchAnswer
}

var batchPool = sync.Pool{New: func() any { return new(batchMem) }}

func getBatchMem() *batchMem { return batchPool.Get().(*batchMem) }

// putBatchMem pools m, cleared, unless it grew beyond a batch of MaxBatch
// checks: a body of many empty checks is decoded before it is refused.
func putBatchMem(m *batchMem) {
	results, rules := m.answer.Size()
	if cap(m.br.Checks) > MaxBatch || cap(m.checks) > MaxBatch || results > MaxBatch || rules > 8*MaxBatch || cap(m.body.b) > 1<<20 {
		return
	}
	m.reset()
	batchPool.Put(m)
}

// reset clears m for the next batch, which decodes into its memory:
// encoding/json keeps the fields of an element of a slice's spare room
// that the JSON leaves out.
func (m *batchMem) reset() {
	clear(m.br.Checks[:cap(m.br.Checks)])
	m.br = batchRequest{Checks: m.br.Checks[:0]}
	clear(m.checks[:cap(m.checks)])
	m.body.b = m.body.b[:0]
}

// decodeBatch decodes and validates the body of POST /api/v1/batch-check,
// in m's memory (cleared by putBatchMem, or new).
func decodeBatch(data []byte, m *batchMem) ([]engine.Check, engine.BatchMode, error) {
	br := &m.br
	if err := decodeStrict(data, br); err != nil {
		return nil, 0, err
	}
	mode, err := parseMode(br.Mode)
	if err != nil {
		return nil, 0, err
	}
	if _, err := parsePriority("priority", br.Priority); err != nil {
		return nil, 0, err
	}
	// The batch's identity fields are checked even when every check has
	// its own, so that a bad one is never silently ignored.
	for _, id := range [...]struct{ name, val string }{
		{"client_id", br.ClientID}, {"user", br.User}, {"ip", br.IP}, {"api_key", br.APIKey},
	} {
		if err := engine.ValidateField(id.name, id.val); err != nil {
			return nil, 0, err
		}
	}
	checks := m.checks[:0]
	if cap(checks) < len(br.Checks) {
		checks = make([]engine.Check, len(br.Checks))
	}
	checks = checks[:len(br.Checks)]
	m.checks = checks
	for i := range br.Checks {
		cr := &br.Checks[i]
		if cr.ClientID == "" {
			cr.ClientID = br.ClientID
		}
		if cr.User == "" {
			cr.User = br.User
		}
		if cr.IP == "" {
			cr.IP = br.IP
		}
		if cr.APIKey == "" {
			cr.APIKey = br.APIKey
		}
		if cr.Priority == "" {
			cr.Priority = br.Priority
		}
		if cr.ReservationID != "" {
			return nil, 0, engine.InBatch(i, fieldErr("reservation_id", "not accepted in a batch; use POST /api/v1/check"))
		}
		if err := cr.toCheck(&checks[i]); err != nil {
			return nil, 0, engine.InBatch(i, err)
		}
	}
	if err := engine.ValidateBatch(checks, mode); err != nil {
		return nil, 0, err
	}
	return checks, mode, nil
}
