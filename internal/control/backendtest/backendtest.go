// Package backendtest is the conformance suite of control.Backend: every
// store of the control plane passes Run.
package backendtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/control"
)

// Run checks the Backend that open returns, a new and empty one for each
// subtest.
func Run(t *testing.T, open func(t *testing.T) control.Backend) {
	t.Run("Versions", func(t *testing.T) { testVersions(t, open(t)) })
	t.Run("Preconditions", func(t *testing.T) { testPreconditions(t, open(t)) })
	t.Run("RacingWriters", func(t *testing.T) { testRacing(t, open(t)) })
	t.Run("Watch", func(t *testing.T) { testWatch(t, open(t)) })
	t.Run("Register", func(t *testing.T) { testRegister(t, open(t)) })
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func put(k, v string, ifv int64) control.Op {
	return control.Op{Key: k, Value: []byte(v), IfVersion: ifv}
}

func get(t *testing.T, b control.Backend, prefix string) map[string]control.KV {
	t.Helper()
	kvs, _, err := b.Get(ctxT(t), prefix)
	if err != nil {
		t.Fatalf("Get(%q): %v", prefix, err)
	}
	m := map[string]control.KV{}
	for i, kv := range kvs {
		if i > 0 && kvs[i-1].Key >= kv.Key {
			t.Errorf("Get(%q): keys not sorted: %q then %q", prefix, kvs[i-1].Key, kv.Key)
		}
		m[kv.Key] = kv
	}
	return m
}

func testVersions(t *testing.T, b control.Backend) {
	ctx := ctxT(t)
	r1, err := b.Txn(ctx, []control.Op{put("a/1", "x", control.MustNotExist), put("a/2", "y", control.MustNotExist)})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.Txn(ctx, []control.Op{put("a/1", "x2", 1)})
	if err != nil {
		t.Fatal(err)
	}
	if r2 != r1+1 {
		t.Errorf("revisions %d then %d, want one apart", r1, r2)
	}
	m := get(t, b, "a/")
	if kv := m["a/1"]; string(kv.Value) != "x2" || kv.Version != 2 || kv.ModRevision != r2 {
		t.Errorf("a/1 = %q v%d mod %d, want x2 v2 mod %d", kv.Value, kv.Version, kv.ModRevision, r2)
	}
	if kv := m["a/2"]; kv.Version != 1 || kv.ModRevision != r1 {
		t.Errorf("a/2 = v%d mod %d, want v1 mod %d", kv.Version, kv.ModRevision, r1)
	}
	if _, err := b.Txn(ctx, []control.Op{{Key: "a/2", Delete: true, IfVersion: 1}}); err != nil {
		t.Fatal(err)
	}
	if m := get(t, b, "a/"); len(m) != 1 {
		t.Errorf("after delete: %d keys, want 1", len(m))
	}
	if m := get(t, b, "b/"); len(m) != 0 {
		t.Errorf("Get(b/): %d keys, want 0", len(m))
	}
}

func testPreconditions(t *testing.T, b control.Backend) {
	ctx := ctxT(t)
	if _, err := b.Txn(ctx, []control.Op{put("k", "1", control.MustNotExist)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		ops  []control.Op
		cur  int64
	}{
		{"exists", []control.Op{put("k", "2", control.MustNotExist)}, 1},
		{"stale", []control.Op{put("new", "n", control.MustNotExist), put("k", "2", 7)}, 1},
		{"absent", []control.Op{{Key: "nope", Delete: true, IfVersion: 1}}, 0},
	} {
		_, err := b.Txn(ctx, tc.ops)
		var ve *control.VersionError
		if !errors.As(err, &ve) || ve.Current != tc.cur {
			t.Errorf("%s: err %v, want a *VersionError at %d", tc.name, err, tc.cur)
		}
	}
	m := get(t, b, "")
	if len(m) != 1 || string(m["k"].Value) != "1" {
		t.Errorf("after failed Txns: %v, want only k=1", m)
	}
	if _, err := b.Txn(ctx, []control.Op{put("k", "3", control.AnyVersion)}); err != nil {
		t.Errorf("AnyVersion: %v", err)
	}
}

func testRacing(t *testing.T, b control.Backend) {
	ctx := ctxT(t)
	if _, err := b.Txn(ctx, []control.Op{put("c", "0", control.MustNotExist)}); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, errs[i] = b.Txn(ctx, []control.Op{put("c", fmt.Sprint(i+1), 1)}) })
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		var ve *control.VersionError
		switch {
		case err == nil:
			won++
		case !errors.As(err, &ve):
			t.Errorf("loser: %v, want a *VersionError", err)
		}
	}
	if won != 1 {
		t.Errorf("%d writers won, want 1", won)
	}
	if kv := get(t, b, "c")["c"]; kv.Version != 2 {
		t.Errorf("c at version %d, want 2", kv.Version)
	}
}

func testWatch(t *testing.T, b control.Backend) {
	ctx := ctxT(t)
	r0, err := b.Txn(ctx, []control.Op{put("w/a", "1", control.MustNotExist)})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	ch := b.Watch(wctx, "w/", r0)
	r1, _ := b.Txn(ctx, []control.Op{put("x/other", "o", control.AnyVersion)})
	r2, _ := b.Txn(ctx, []control.Op{put("w/a", "2", 1), put("w/b", "1", control.MustNotExist)})
	r3, _ := b.Txn(ctx, []control.Op{{Key: "w/a", Delete: true, IfVersion: control.AnyVersion}})
	want := []struct {
		key string
		del bool
		rev int64
	}{{"w/a", false, r0}, {"w/a", false, r2}, {"w/b", false, r2}, {"w/a", true, r3}}
	var got []control.Event
	for len(got) < len(want) {
		select {
		case r, ok := <-ch:
			if !ok || r.Err != nil || r.Compacted {
				t.Fatalf("watch ended: %+v", r)
			}
			got = append(got, r.Events...)
		case <-ctx.Done():
			t.Fatalf("watch: %d events after 10s, want %d", len(got), len(want))
		}
	}
	for i, w := range want {
		if i >= len(got) || got[i].KV.Key != w.key || got[i].Delete != w.del || got[i].KV.ModRevision != w.rev {
			t.Fatalf("events %+v, want %+v", got, want)
		}
	}
	_ = r1
	cancel()
	for range ch {
	}
	// Resuming from the revision after the last seen repeats nothing.
	ch = b.Watch(ctx, "w/", r3+1)
	r4, _ := b.Txn(ctx, []control.Op{put("w/c", "1", control.MustNotExist)})
	select {
	case r := <-ch:
		if len(r.Events) != 1 || r.Events[0].KV.Key != "w/c" || r.Events[0].KV.ModRevision != r4 {
			t.Errorf("resumed watch: %+v, want w/c at %d", r, r4)
		}
	case <-ctx.Done():
		t.Fatal("resumed watch: nothing after 10s")
	}
}

func testRegister(t *testing.T, b control.Backend) {
	ctx := ctxT(t)
	rctx, cancel := context.WithCancel(ctx)
	if err := b.Register(rctx, "inst/a", []byte("1"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(rctx, "inst/a", []byte("2"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if kv := get(t, b, "inst/")["inst/a"]; string(kv.Value) != "2" {
		t.Errorf("registered value %q, want 2", kv.Value)
	}
	cancel()
	for {
		if len(get(t, b, "inst/")) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("registration still there 10s after its context ended")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
