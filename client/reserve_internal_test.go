package client

import (
	"errors"
	"testing"
)

// FuzzDecodeReservation decodes arbitrary answers: decodeReservation never
// panics, refuses with ErrServer, and what it accepts has an ID and a known
// status.
func FuzzDecodeReservation(f *testing.F) {
	for _, s := range []string{
		`{"reservation_id":"rsv_1","status":"granted","tokens_reserved":3,"expires_at":"2026-11-27T05:54:37.461833Z","position_in_queue":0}`,
		`{"reservation_id":"rsv_2","status":"queued","tokens_needed":4,"position_in_queue":1,"estimated_grant_at":"2026-11-27T05:54:37Z"}`,
		`{"reservation_id":"rsv_3","status":"granted","client_id":"c1","resource":"/r","rule":"demo","tokens_reserved":3,"tokens_remaining":2,"tokens_used":1,"granted_at":"2026-11-27T05:53:37Z","expires_at":"2026-11-27T05:54:37Z"}`,
		`{"reservation_id":"rsv_4","status":"released"}`,
		`{"expires_at":"yesterday"}`,
		`[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := decodeReservation(raw)
		if err != nil {
			if r != nil || !errors.Is(err, ErrServer) {
				t.Fatalf("decodeReservation(%q) = %v, %v; want nil and ErrServer", raw, r, err)
			}
			return
		}
		if r.ID == "" || (r.Status != StatusGranted && r.Status != StatusQueued) {
			t.Fatalf("decodeReservation(%q) = %+v: no ID or an unknown status", raw, r)
		}
	})
}
