package engine

import (
	"errors"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// logPolicy returns a policy of one sliding window log of limit n.
func logPolicy(t *testing.T, n int) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(`version: 1
rules:
  - { id: log, match: { resource: /r }, algorithm: sliding_window_log, window: 1m, limit: `+strconv.Itoa(n)+` }
`))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAcceptsStoreBound: a store that keeps fewer log entries than the
// policy package allows refuses, at New and at Accepts, a sliding window
// log above its bound; a store of the policy package's bound takes every
// policy.
func TestAcceptsStoreBound(t *testing.T) {
	small, err := memory.New(memory.Config{MaxLogEntries: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if _, err := New(Config{Store: small, Policy: logPolicy(t, 500)}); !errors.Is(err, store.ErrLogTooLarge) {
		t.Errorf("New on a store of 100 log entries, a log of 500: %v, want ErrLogTooLarge", err)
	}
	e, err := New(Config{Store: small, Local: newStore(t), Policy: logPolicy(t, 40)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Accepts(logPolicy(t, 500)); !errors.Is(err, store.ErrLogTooLarge) {
		t.Errorf("Accepts of a log of 500 on a store of 100: %v, want ErrLogTooLarge", err)
	}
	big, _ := newEngine(t, "")
	if err := big.Accepts(logPolicy(t, 8000)); err != nil {
		t.Errorf("Accepts of a log of 8000 (9600 at high priority) on the default store: %v", err)
	}
}
