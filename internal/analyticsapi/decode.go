package analyticsapi

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/analytics"
)

// Bounds of a query.
const (
	// MaxRange is the longest span between start_time and end_time.
	MaxRange = 400 * 24 * time.Hour
	// DefaultRange is the span before end_time when start_time is absent.
	DefaultRange = time.Hour
	// MaxPoints bounds the points of a time series: a range of minutes
	// longer than MaxPoints minutes (about 34 days) needs hours or days.
	MaxPoints = 50_000
	// MaxNameBytes bounds client_id, resource and region.
	MaxNameBytes = 1024
)

// ErrBadQuery is wrapped by the errors of ParseQuery.
var ErrBadQuery = errors.New("sluice: analytics: bad query")

// FieldError is a query parameter ParseQuery refuses, and why.
type FieldError struct {
	Field, Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap returns ErrBadQuery.
func (e *FieldError) Unwrap() error { return ErrBadQuery }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ParseQuery returns the filter of the query string raw of GET
// /api/v1/analytics, whose end_time defaults to now. It refuses, naming
// the parameter, what url.ParseQuery would drop silently (a bad escape, a
// ';'), a parameter unknown or given twice, a timestamp that is not
// RFC 3339, start_time not before end_time, a range over MaxRange, an
// unknown granularity, a time series of more than MaxPoints points, and a
// name that is not UTF-8, holds a NUL byte or is longer than MaxNameBytes.
// With a granularity of hours or days, the range is widened to whole UTC
// hours or days.
func ParseQuery(raw string, now time.Time) (analytics.Filter, error) {
	var (
		f              analytics.Filter
		start, end     string
		gran           = "minute"
		seen           = map[string]bool{}
		hasStart, hasE bool
	)
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		rawName, rawVal, _ := strings.Cut(pair, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil || name == "" || len(name) > 64 || !utf8.ValidString(name) {
			return f, fieldErr("query", "a parameter whose name is empty or cannot be decoded")
		}
		if strings.Contains(pair, ";") {
			return f, fieldErr(name, "holds a ';', which is not a separator; escape it as %%3B")
		}
		val, err := url.QueryUnescape(rawVal)
		if err != nil {
			return f, fieldErr(name, "cannot be decoded: %v", err)
		}
		if seen[name] {
			return f, fieldErr(name, "given more than once")
		}
		seen[name] = true
		switch name {
		case "client_id":
			f.Client = val
		case "resource":
			f.Resource = val
		case "region":
			f.Region = val
		case "start_time":
			start, hasStart = val, true
		case "end_time":
			end, hasE = val, true
		case "granularity":
			gran = val
		default:
			return f, fieldErr(name, "unknown query parameter (want client_id, resource, region, start_time, end_time or granularity)")
		}
		if err := checkName(name, val); err != nil {
			return f, err
		}
	}
	switch gran {
	case "minute":
		f.Granularity = analytics.Minute
	case "hour":
		f.Granularity = analytics.Hour
	case "day":
		f.Granularity = analytics.Day
	default:
		return f, fieldErr("granularity", "want minute, hour or day")
	}
	f.End = now.UTC().Truncate(time.Second)
	if hasE {
		t, err := parseTime("end_time", end)
		if err != nil {
			return f, err
		}
		f.End = t
	}
	f.Start = f.End.Add(-DefaultRange)
	if hasStart {
		t, err := parseTime("start_time", start)
		if err != nil {
			return f, err
		}
		f.Start = t
	}
	if !f.Start.Before(f.End) {
		return f, fieldErr("start_time", "must be before end_time (%s)", f.End.Format(time.RFC3339))
	}
	if f.End.Sub(f.Start) > MaxRange {
		return f, fieldErr("start_time", "more than 400 days before end_time")
	}
	// Hours and days are counted whole: the range is widened to the step,
	// so that the first and last points are not parts of one.
	if f.Granularity != analytics.Minute {
		step := map[analytics.Granularity]time.Duration{analytics.Hour: time.Hour, analytics.Day: 24 * time.Hour}[f.Granularity]
		f.Start = f.Start.Truncate(step)
		if e := f.End.Truncate(step); !e.Equal(f.End) {
			f.End = e.Add(step)
		}
	}
	if f.Granularity == analytics.Minute && f.End.Sub(f.Start)/time.Minute > MaxPoints {
		return f, fieldErr("granularity", "more than %d points from start_time to end_time: ask for hours or days", MaxPoints)
	}
	return f, nil
}

// checkName refuses a client, resource or region that no check can have
// and that PostgreSQL would refuse: not UTF-8, with a NUL byte, too long.
func checkName(name, val string) error {
	switch {
	case len(val) > MaxNameBytes:
		return fieldErr(name, "longer than %d bytes", MaxNameBytes)
	case !utf8.ValidString(val):
		return fieldErr(name, "not valid UTF-8")
	case strings.IndexByte(val, 0) >= 0:
		return fieldErr(name, "holds a NUL byte")
	}
	return nil
}

// parseTime parses an RFC 3339 timestamp of a year from 1 to 9999.
func parseTime(field, v string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return t, fieldErr(field, "want an RFC 3339 timestamp such as 2026-11-27T08:00:00Z, got %q", truncate(v))
	}
	if t = t.UTC(); t.Year() < 1 || t.Year() > 9999 {
		return t, fieldErr(field, "out of range: want a year from 1 to 9999 in UTC")
	}
	return t, nil
}

// truncate shortens v for an error message.
func truncate(v string) string {
	if len(v) <= 64 {
		return v
	}
	return strings.ToValidUTF8(v[:64], "") + "..."
}
