package engine

import (
	"context"
	"reflect"
	"testing"
)

// TestBatchCheckIntoReused: an answer reused from batch to batch answers
// as BatchCheck does, on an engine of its own with the same history, in
// both modes, for deny-listed checks, errors and repeated idempotency keys;
// and a result kept for an idempotency key does not live in the answer,
// whose next batch would overwrite it.
func TestBatchCheckIntoReused(t *testing.T) {
	const pol = `
version: 1
deny: [{client: banned}]
rules:
  - {id: api, match: {resource: /api}, limit: 5, window: 1m, algorithm: fixed_window}
  - {id: log, match: {resource: /api}, dimension: user, limit: 3, window: 1m, algorithm: sliding_window_log}
  - {id: shadow, match: {resource: /api}, limit: 2, window: 1m, algorithm: fixed_window, shadow: true}
  - {id: compute, match: {resource: /compute}, limit: 5, window: 1m, algorithm: fixed_window}
`
	alloc, _ := newEngine(t, pol)
	reused, _ := newEngine(t, pol)
	ctx := context.Background()
	batches := []struct {
		checks []Check
		mode   BatchMode
	}{
		{[]Check{{ClientID: "b", Resource: "/api", User: "u", Cost: 2}, {ClientID: "b", Resource: "/compute", Cost: 4}}, AllOrNothing},
		{[]Check{{ClientID: "b", Resource: "/api", User: "u", Cost: 1, IdempotencyKey: "k"}, {ClientID: "b", Resource: "/compute", Cost: 4}}, BestEffort},
		{[]Check{{ClientID: "b", Resource: "/api", User: "u", Cost: 1}, {ClientID: "b", Resource: "/api", User: "u", Cost: 1}, {ClientID: "b", Resource: "/api", User: "v", Cost: 1}}, AllOrNothing},
		{[]Check{{ClientID: "b", Resource: "/api", User: "u", Cost: 1, IdempotencyKey: "k"}, {ClientID: "c", Resource: "/api", User: "w", Cost: 1}}, BestEffort},
		{[]Check{{ClientID: "ok", Resource: "/compute", Cost: 1}, {ClientID: "banned", Resource: "/api", Cost: 1}}, AllOrNothing},
		{[]Check{{ClientID: "ok", Resource: "/compute", Cost: 1}, {ClientID: ""}}, AllOrNothing},
		{[]Check{{ClientID: "b", Resource: "/api", User: "u", Cost: 1, IdempotencyKey: "k"}, {ClientID: "banned"}}, BestEffort},
		{[]Check{{ClientID: "d", Resource: "/api", User: "x", Cost: 9}, {ClientID: "d", Resource: "/compute", Cost: 1}}, AllOrNothing},
	}
	var a BatchAnswer
	for i, b := range batches {
		for j := range b.checks {
			b.checks[j].Now = t0
		}
		want, wantErr := alloc.BatchCheck(ctx, b.checks, b.mode)
		err := reused.BatchCheckInto(ctx, b.checks, b.mode, &a)
		if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("batch %d: error %v, want %v", i, err, wantErr)
		}
		if err != nil && len(a.Results) != 0 {
			t.Errorf("batch %d: %d results with an error, want none", i, len(a.Results))
		}
		if err == nil && !reflect.DeepEqual(a.Results, want) {
			t.Errorf("batch %d:\n got %+v\nwant %+v", i, a.Results, want)
		}
	}
}

// TestBatchCheckIntoAllocs: an all-or-nothing batch of 1,000 checks of one
// key, its answer reused, allocates next to nothing: its results and rule
// results, 240 KB when allocated, are the answer's.
func TestBatchCheckIntoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled memory at random")
	}
	e, _ := newEngine(t, `
version: 1
rules:
  - {id: log, match: {resource: /attack}, dimension: client, algorithm: sliding_window_log, limit: 100, window: 1h}
`)
	batch := make([]Check, MaxBatch)
	for i := range batch {
		batch[i] = Check{ClientID: "attacker", Resource: "/attack", Cost: 1}
	}
	ctx := context.Background()
	var a BatchAnswer
	allocs := testing.AllocsPerRun(20, func() {
		if err := e.BatchCheckInto(ctx, batch, AllOrNothing, &a); err != nil {
			t.Fatal(err)
		}
	})
	// The string of the store key, the bulk turn, the memory store's.
	if allocs > 3 {
		t.Errorf("%.0f allocations a batch, want at most 3", allocs)
	}
	if len(a.Results) != MaxBatch || a.Results[0].Allowed {
		t.Errorf("%d results, the first allowed %v; want %d, denied (the batch is over the limit)", len(a.Results), len(a.Results) > 0 && a.Results[0].Allowed, MaxBatch)
	}
}
