package redis

import (
	"strings"
	"testing"
	"time"
)

func TestMultiplex(t *testing.T) {
	for _, tc := range []struct{ conns, want int }{
		{0, 0}, {1, -1}, {2, 1}, {3, 2}, {4, 2}, {5, 3}, {8, 3}, {256, 8}, {1000, 8},
	} {
		if got := multiplex(tc.conns); got != tc.want {
			t.Errorf("multiplex(%d) = %d, want %d", tc.conns, got, tc.want)
		}
	}
	if _, err := New(Config{Addrs: []string{"127.0.0.1:1"}, ConnsPerNode: -1}); err == nil {
		t.Error("New with -1 connections per node: no error")
	}
}

// TestNegativeDurationsRefused: a negative timeout, dial timeout, write
// timeout or flush delay is a configuration error naming it, not a store
// that cannot connect ("i/o timeout") or fails every call.
func TestNegativeDurationsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"timeout", Config{Timeout: -time.Second}},
		{"dial timeout", Config{DialTimeout: -time.Second}},
		{"write timeout", Config{WriteTimeout: -time.Second}},
		{"max flush delay", Config{MaxFlushDelay: -time.Microsecond}},
	} {
		tc.cfg.Addrs = []string{"127.0.0.1:1"}
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.name+": must not be negative") {
			t.Errorf("%s negative: %v", tc.name, err)
		}
	}
}
