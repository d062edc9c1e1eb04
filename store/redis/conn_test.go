package redis

import "testing"

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
