package analyticsapi

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
)

var now = time.Date(2026, 11, 27, 8, 30, 15, 0, time.UTC)

// hour returns the hour h of the day of now.
func hour(h int) time.Time { return time.Date(2026, 11, 27, h, 0, 0, 0, time.UTC) }

func TestParseQuery(t *testing.T) {
	tests := []struct {
		raw   string
		want  analytics.Filter
		field string // the field refused; "" when accepted
	}{
		{raw: "", want: analytics.Filter{Start: now.Add(-time.Hour), End: now}},
		{raw: "client_id=acme&resource=%2Fapi%2Forders&region=eu&granularity=hour",
			want: analytics.Filter{Client: "acme", Resource: "/api/orders", Region: "eu", Start: hour(7), End: hour(9), Granularity: analytics.Hour}},
		{raw: "start_time=2026-11-20T00:00:00Z&end_time=2026-11-27T00:00:00%2B01:00&granularity=day",
			want: analytics.Filter{Start: time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC), Granularity: analytics.Day}},
		{raw: "end_time=2026-11-27T08:00:00Z", want: analytics.Filter{Start: now.Add(-90*time.Minute + -15*time.Second), End: now.Add(-30*time.Minute - 15*time.Second)}},
		{raw: "start_time=2026-11-27T08:00:00Z", want: analytics.Filter{Start: now.Add(-30*time.Minute - 15*time.Second), End: now}},
		{raw: "start_time=2026-11-27T09:00:00Z", field: "start_time"},
		{raw: "start_time=2026-11-27T08:30:15Z", field: "start_time"},
		{raw: "start_time=2025-10-01T00:00:00Z&granularity=day", field: "start_time"},
		{raw: "start_time=2025-11-01T00:00:00Z&granularity=day", want: analytics.Filter{Start: time.Date(2025, 11, 1, 0, 0, 0, 0, time.UTC), End: hour(24), Granularity: analytics.Day}},
		{raw: "start_time=2026-11-27T05:59:59Z&end_time=2026-11-27T06:00:00Z&granularity=hour", want: analytics.Filter{Start: hour(5), End: hour(6), Granularity: analytics.Hour}},
		{raw: "start_time=2026-01-01T00:00:00Z", field: "granularity"},
		{raw: "start_time=yesterday", field: "start_time"},
		{raw: "end_time=2026-11-27", field: "end_time"},
		{raw: "end_time=0000-01-01T00:00:00%2B01:00", field: "end_time"},
		{raw: "granularity=week", field: "granularity"},
		{raw: "granularity=", field: "granularity"},
		{raw: "limit=3", field: "limit"},
		{raw: "client_id=a&client_id=b", field: "client_id"},
		{raw: "client_id=%zz", field: "client_id"},
		{raw: "client_id=a;b", field: "client_id"},
		{raw: "client_id=%00", field: "client_id"},
		{raw: "region=%ff", field: "region"},
		{raw: "resource=" + strings.Repeat("x", MaxNameBytes+1), field: "resource"},
		{raw: "%zz=1", field: "query"},
		{raw: "=1", field: "query"},
	}
	for _, tt := range tests {
		got, err := ParseQuery(tt.raw, now)
		if tt.field != "" {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, ErrBadQuery) {
				t.Errorf("ParseQuery(%q) = %v, want an error naming %s", tt.raw, err, tt.field)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseQuery(%q) = %+v, %v; want %+v", tt.raw, got, err, tt.want)
		}
	}
}

// FuzzParseQuery checks that any query string is refused with a field
// error or gives a filter the stores accept.
func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{"", "client_id=a&granularity=day&start_time=2026-01-01T00:00:00Z",
		"end_time=2026-11-27T08:00:00%2B05:00", "region=%ff%00", "a=b;c", "granularity=hour&granularity=day"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := ParseQuery(raw, now)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field == "" {
				t.Fatalf("ParseQuery(%q): error %v names no field", raw, err)
			}
			return
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("ParseQuery(%q) = %+v, which the stores refuse: %v", raw, got, err)
		}
		if got.End.Sub(got.Start) > MaxRange {
			t.Fatalf("ParseQuery(%q): range %s", raw, got.End.Sub(got.Start))
		}
	})
}
