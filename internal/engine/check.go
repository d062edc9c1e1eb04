// The fields of a check and the one place they are validated.

package engine

import (
	"strconv"
	"unicode/utf8"
)

// Bounds on the fields of a check.
const (
	// MaxIdentifierLen bounds client_id, user, ip, api_key, method,
	// operation and idempotency_key, in bytes.
	MaxIdentifierLen = 256
	// MaxResourceLen bounds resource, in bytes.
	MaxResourceLen = 2048
	// MaxCost bounds the cost of a check before multipliers.
	MaxCost = 1 << 30
)

// Validate reports the first bad field of c as a *FieldError naming it by
// its wire name, the same in every API: client_id (required), resource,
// operation, idempotency_key, user, ip, api_key and method (each as
// ValidateField says), cost (0 to MaxCost) and priority (one of the three).
//
// Transports decode their wire format into a Check and call Validate (or
// ValidateBatch) before anything else, so that a refused request reaches
// neither the engine nor its metrics; the engine's Check, BatchCheck,
// Status and Reset call it too, for their other callers. Every rule on the
// fields of a check is here, and nowhere else.
func (c *Check) Validate() error {
	for _, f := range [...]struct {
		name, v string
		limit   int
	}{
		{"client_id", c.ClientID, MaxIdentifierLen}, {"resource", c.Resource, MaxResourceLen},
		{"operation", c.Operation, MaxIdentifierLen}, {"idempotency_key", c.IdempotencyKey, MaxIdentifierLen},
		{"user", c.User, MaxIdentifierLen}, {"ip", c.IP, MaxIdentifierLen},
		{"api_key", c.APIKey, MaxIdentifierLen}, {"method", c.Method, MaxIdentifierLen},
	} {
		if err := validateText(f.name, f.v, f.limit); err != nil {
			return err
		}
	}
	switch {
	case c.ClientID == "":
		return &FieldError{Field: "client_id", Reason: "required"}
	case c.Cost < 0:
		return &FieldError{Field: "cost", Reason: "must not be negative, got " + strconv.FormatInt(c.Cost, 10)}
	case c.Cost > MaxCost:
		return &FieldError{Field: "cost", Reason: strconv.FormatInt(c.Cost, 10) + " is above the maximum " + strconv.Itoa(MaxCost)}
	case c.Priority > PriorityLow:
		return &FieldError{Field: "priority", Reason: "unknown priority " + strconv.Itoa(int(c.Priority))}
	}
	return nil
}

// ValidateField reports a bad value of the text field named field (of a
// check, a batch or a reservation) as a *FieldError: longer than
// MaxResourceLen for a resource (a field named "resource" or ending in
// ".resource"), than MaxIdentifierLen for any other, invalid UTF-8, or
// holding a control character. The empty string is valid.
func ValidateField(field, v string) error {
	limit := MaxIdentifierLen
	if isResource(field) {
		limit = MaxResourceLen
	}
	return validateText(field, v, limit)
}

// validateText is ValidateField with the field's bound given: one pass
// over the bytes, which falls back to a full UTF-8 check at the first
// byte that is not ASCII (every check's fields pass it, so it is on the
// check path).
func validateText(field, v string, limit int) error {
	if len(v) > limit {
		return &FieldError{Field: field, Reason: strconv.Itoa(len(v)) + " bytes long, the limit is " + strconv.Itoa(limit)}
	}
	for i := 0; i < len(v); i++ {
		switch b := v[i]; {
		case b < 0x20 || b == 0x7f:
			if !utf8.ValidString(v) { // an invalid string is told as such first
				return &FieldError{Field: field, Reason: "invalid UTF-8"}
			}
			return &FieldError{Field: field, Reason: "holds a control character"}
		case b >= utf8.RuneSelf:
			if !utf8.ValidString(v[i:]) {
				return &FieldError{Field: field, Reason: "invalid UTF-8"}
			}
			// The bytes of a multi-byte sequence are all above 0x7f:
			// what is left to find are control characters.
			for j := i + 1; j < len(v); j++ {
				if v[j] < 0x20 || v[j] == 0x7f {
					return &FieldError{Field: field, Reason: "holds a control character"}
				}
			}
			return nil
		}
	}
	return nil
}

func isResource(field string) bool {
	const r = "resource"
	n := len(field)
	return field == r || n > len(r) && field[n-len(r)-1] == '.' && field[n-len(r):] == r
}
