// The descriptors of an Envoy call, their statuses, and the one place
// their fields are checked.

package envoyrls

import (
	"math"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/policy"
)

// MaxEntryBytes is the longest key or value of a descriptor entry
// accepted, 64 KiB: above Envoy's own default limit on request headers
// (60 KiB), which its request_headers action takes a value from. A
// refused descriptor is an error to Envoy, which lets the request through
// unless failure_mode_deny is set, so a shorter bound would let a client
// that controls such a header past every limit. Store keys longer than
// keyspace.MaxKeyBytes are shortened.
const MaxEntryBytes = 64 << 10

// Descriptor is one Envoy rate-limit descriptor: an ordered list of
// key/value entries, with an optional per-descriptor hits addend.
type Descriptor struct {
	Entries []DescriptorEntry
	// HitsAddend is what the descriptor is charged, in place of the
	// request's addend, when HitsSet is true; 0 then decides it without
	// consuming anything. It is ignored when HitsSet is false.
	HitsAddend uint64
	// HitsSet reports that the descriptor carries its own HitsAddend.
	HitsSet bool
	// Limit, when set, is the limit the descriptor asks for in place of
	// the configured one (Envoy's limit override).
	Limit LimitOverride
}

// LimitOverride is an Envoy descriptor's limit override: RequestsPerUnit
// per Unit, counted on fixed windows. The zero value is no override.
type LimitOverride struct {
	// RequestsPerUnit is the limit, 1 to math.MaxUint32.
	RequestsPerUnit int64
	// Unit is the window, such as a minute, or 30 seconds for a unit of a
	// second with a multiplier of 30; at most sluice.MaxWindow.
	Unit time.Duration
}

// DescriptorEntry is one key/value pair of a Descriptor.
type DescriptorEntry = policy.DescriptorEntry

// DescriptorStatus is the answer for one descriptor, as Envoy expects it.
type DescriptorStatus struct {
	OverLimit bool
	// HasLimit is false when no rule matched the descriptor (Envoy's OK
	// with no current_limit), and for unlimited descriptors.
	HasLimit bool
	// Limit is requests per Unit (Envoy's current_limit).
	Limit int64
	Unit  time.Duration
	// Remaining is Envoy's limit_remaining; math.MaxUint32 for an
	// unlimited descriptor.
	Remaining          int64
	DurationUntilReset time.Duration
	// Rule is the configuration entry's full key, such as
	// "messaging.message_type_marketing.to_number"; "" when none matched.
	Rule string
	// Shadow reports a shadow_mode limit: it never reports over limit.
	Shadow bool
}

// validate reports the first bad field of a call of domain for descs, of
// hitsAddend hits, as an *engine.FieldError; with emptyOK, a descriptor
// with no entries is valid (it is not limited).
func validate(domain string, descs []Descriptor, hitsAddend uint64, emptyOK bool) error {
	if domain == "" {
		return &engine.FieldError{Field: "domain", Reason: "is required"}
	}
	if len(descs) == 0 {
		return &engine.FieldError{Field: "descriptors", Reason: "must not be empty"}
	}
	if len(descs) > engine.MaxBatch {
		return &engine.FieldError{Field: "descriptors", Reason: "more than " + strconv.Itoa(engine.MaxBatch) + " descriptors"}
	}
	if hitsAddend > engine.MaxCost {
		return &engine.FieldError{Field: "hits_addend", Reason: "must be at most " + strconv.Itoa(engine.MaxCost)}
	}
	for i, d := range descs {
		if d.HitsAddend > engine.MaxCost {
			return &engine.FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].hits_addend", Reason: "must be at most " + strconv.Itoa(engine.MaxCost)}
		}
		if len(d.Entries) == 0 && !emptyOK {
			return &engine.FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].entries", Reason: "must not be empty"}
		}
		if o := d.Limit; o != (LimitOverride{}) {
			if o.RequestsPerUnit < 1 || o.RequestsPerUnit > math.MaxUint32 {
				return &engine.FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].limit.requests_per_unit", Reason: "must be between 1 and " + strconv.Itoa(math.MaxUint32)}
			}
			if o.Unit <= 0 || o.Unit > sluice.MaxWindow {
				return &engine.FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].limit.unit", Reason: "must be a window longer than 0 and at most " + sluice.MaxWindow.String()}
			}
		}
		for j, en := range d.Entries {
			if en.Key == "" {
				return &engine.FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].entries[" + strconv.Itoa(j) + "].key", Reason: "is required"}
			}
			if len(en.Key) > MaxEntryBytes || len(en.Value) > MaxEntryBytes {
				return &engine.FieldError{Field: "descriptors[" + strconv.Itoa(i) + "].entries[" + strconv.Itoa(j) + "]", Reason: "longer than " + strconv.Itoa(MaxEntryBytes) + " bytes"}
			}
		}
	}
	return nil
}
