// The wire request: Envoy's RateLimitRequest, checked and turned into
// Descriptors.

package envoyrls

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/grpccodec"
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalid, fmt.Sprintf(format, args...))
}

func checkString(what, s string, limit int) error {
	switch {
	case len(s) > limit:
		return invalid("%s is %d bytes long, the limit is %d", what, len(s), limit)
	case !utf8.ValidString(s):
		return invalid("%s is not valid UTF-8", what)
	}
	return nil
}

// Descriptors converts and validates the descriptors of req: the mapping
// from Envoy's wire types to the Decider's. A descriptor with no entries is
// refused.
func Descriptors(req *rlsv3.RateLimitRequest) ([]Descriptor, error) {
	return descriptors(req, false)
}

// descriptors is Descriptors; with emptyOK, a descriptor with no entries
// is kept, with no entries (the Decider then needs compat).
func descriptors(req *rlsv3.RateLimitRequest, emptyOK bool) ([]Descriptor, error) {
	if reason, ok := grpccodec.Malformed(req); ok {
		return nil, invalid("malformed request: %s", reason)
	}
	if field, ok := grpccodec.InvalidUTF8(req); ok {
		return nil, invalid("%s: invalid UTF-8", field)
	}
	if req.GetDomain() == "" {
		return nil, invalid("domain: required")
	}
	if err := checkString("domain", req.GetDomain(), MaxDomainBytes); err != nil {
		return nil, err
	}
	in := req.GetDescriptors()
	switch {
	case len(in) == 0:
		return nil, invalid("descriptors: at least one descriptor is required")
	case len(in) > MaxDescriptors:
		return nil, invalid("descriptors: %d descriptors, the limit is %d", len(in), MaxDescriptors)
	case req.GetHitsAddend() > MaxHits:
		return nil, invalid("hits_addend: %d is above the maximum %d", req.GetHitsAddend(), MaxHits)
	}
	descs := make([]Descriptor, len(in))
	for i, d := range in {
		entries := d.GetEntries()
		switch {
		case len(entries) == 0 && !emptyOK:
			return nil, invalid("descriptors[%d]: at least one entry is required", i)
		case len(entries) > MaxEntries:
			return nil, invalid("descriptors[%d]: %d entries, the limit is %d", i, len(entries), MaxEntries)
		case d.GetIsNegativeHits():
			return nil, invalid("descriptors[%d]: is_negative_hits is not supported", i)
		}
		descs[i].Entries = make([]DescriptorEntry, len(entries))
		for j, e := range entries {
			if e.GetKey() == "" {
				return nil, invalid("descriptors[%d].entries[%d].key: required", i, j)
			}
			// The field names are formatted only for an error: this is
			// the path of every Envoy request.
			if checkString("", e.GetKey(), MaxEntryBytes) != nil {
				return nil, checkString(fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), e.GetKey(), MaxEntryBytes)
			}
			if checkString("", e.GetValue(), MaxEntryBytes) != nil {
				return nil, checkString(fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), e.GetValue(), MaxEntryBytes)
			}
			descs[i].Entries[j] = DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > MaxHits {
				return nil, invalid("descriptors[%d].hits_addend: %d is above the maximum %d", i, h.GetValue(), MaxHits)
			}
			// Set, it replaces the request's addend; 0 decides the
			// descriptor without charging it.
			descs[i].HitsAddend, descs[i].HitsSet = h.GetValue(), true
		}
		if o := d.GetLimit(); o != nil {
			lim, err := limitOverride(o)
			if err != nil {
				return nil, invalid("descriptors[%d].limit.%v", i, err)
			}
			descs[i].Limit = lim
		}
	}
	return descs, nil
}

// limitOverride converts a descriptor's limit override; an error starts
// with the name of the field it is about.
func limitOverride(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (LimitOverride, error) {
	// The override's units are named as those of an answer (without WEEK).
	var unit time.Duration
	for _, u := range units {
		if u.unit.String() == o.GetUnit().String() {
			unit = u.d
		}
	}
	if unit == 0 {
		return LimitOverride{}, fmt.Errorf("unit: %v is not a unit (want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)", o.GetUnit())
	}
	if o.GetRequestsPerUnit() == 0 {
		return LimitOverride{}, errors.New("requests_per_unit: must be at least 1")
	}
	mult := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = m.GetValue()
		if mult == 0 {
			return LimitOverride{}, errors.New("unit_multiplier: must be at least 1")
		}
		if time.Duration(mult) > sluice.MaxWindow/unit {
			return LimitOverride{}, fmt.Errorf("unit_multiplier: %d times %v is longer than %v", mult, o.GetUnit(), sluice.MaxWindow)
		}
	}
	return LimitOverride{RequestsPerUnit: int64(o.GetRequestsPerUnit()), Unit: time.Duration(mult) * unit}, nil
}
