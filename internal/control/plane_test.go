package control_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/control/filestore"
	"github.com/sluicehq/sluice/internal/policy"
)

var admin = control.Actor{Name: "alice", Role: control.RoleAdmin}

// layers records the layers a Plane applies.
type layers struct {
	mu   sync.Mutex
	all  []*policy.Layer
	wake chan struct{}
}

func newLayers() *layers { return &layers{wake: make(chan struct{}, 1)} }

func (l *layers) apply(x *policy.Layer) error {
	l.mu.Lock()
	l.all = append(l.all, x)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

func (l *layers) last() *policy.Layer {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.all) == 0 {
		return nil
	}
	return l.all[len(l.all)-1]
}

// waitFor waits until the last layer applied satisfies ok.
func (l *layers) waitFor(t *testing.T, what string, ok func(*policy.Layer) bool) *policy.Layer {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if x := l.last(); x != nil && ok(x) {
			return x
		}
		select {
		case <-l.wake:
		case <-deadline:
			t.Fatalf("no layer with %s after 10s; last %+v", what, l.last())
		}
	}
}

func openFile(t *testing.T, o control.Options) *control.Plane {
	t.Helper()
	s, err := filestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	o.Backend = s
	p, err := control.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func rule(id string, limit int) control.Rule {
	spec, _ := json.Marshal(map[string]any{"match": map[string]any{"resource": "/api"}, "dimension": "client", "algorithm": "fixed_window", "limit": limit, "window": "1m"})
	return control.Rule{ID: id, Spec: spec}
}

func TestRuleVersions(t *testing.T) {
	ctx := context.Background()
	l := newLayers()
	p := openFile(t, control.Options{Apply: l.apply})
	r, created, err := p.PutRule(ctx, admin, rule("api", 10), 0, "first")
	if err != nil || !created || r.Version != 1 {
		t.Fatalf("PutRule: %+v created %v err %v, want version 1 created", r, created, err)
	}
	r, created, err = p.PutRule(ctx, admin, rule("api", 20), 1, "second")
	if err != nil || created || r.Version != 2 {
		t.Fatalf("PutRule v1: %+v created %v err %v, want version 2", r, created, err)
	}
	_, _, err = p.PutRule(ctx, admin, rule("api", 30), 1, "stale")
	var ce *control.ConflictError
	if !errors.As(err, &ce) || ce.Current != 2 {
		t.Fatalf("PutRule stale: %v, want a *ConflictError at 2", err)
	}
	got, err := p.Rule(ctx, "api")
	if err != nil || got.Version != 2 {
		t.Fatalf("Rule: %+v %v", got, err)
	}
	x := l.waitFor(t, "rule api v2", func(x *policy.Layer) bool { return len(x.Rules) == 1 && x.Rules[0].Version == 2 })
	var spec map[string]any
	json.Unmarshal(x.Rules[0].Spec, &spec)
	if spec["id"] != "api" || spec["limit"] != 20.0 {
		t.Errorf("layer rule spec %s, want id api and limit 20", x.Rules[0].Spec)
	}
	if _, err := p.Rule(ctx, "nope"); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("Rule(nope): %v, want ErrNotFound", err)
	}
	if err := p.DeleteRule(ctx, admin, "api", 1, "gone"); !errors.As(err, &ce) {
		t.Errorf("DeleteRule stale: %v, want a *ConflictError", err)
	}
	if err := p.DeleteRule(ctx, admin, "api", 2, "gone"); err != nil {
		t.Fatal(err)
	}
	l.waitFor(t, "no rules", func(x *policy.Layer) bool { return len(x.Rules) == 0 })
	if err := p.DeleteRule(ctx, admin, "api", 0, "again"); !errors.Is(err, control.ErrNotFound) {
		t.Errorf("DeleteRule of a deleted rule: %v, want ErrNotFound", err)
	}
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	p := openFile(t, control.Options{Validate: func(x *policy.Layer) error {
		for _, r := range x.Rules {
			if r.ID == "bad" {
				return &control.FieldError{Field: "spec.limit", Msg: "rejected"}
			}
		}
		return nil
	}})
	now := time.Now()
	for _, tc := range []struct {
		name, field string
		err         error
	}{
		{"rule id", "id", func() error { _, _, err := p.PutRule(ctx, admin, rule("a/b", 1), 0, ""); return err }()},
		{"rule spec", "spec", func() error {
			_, _, err := p.PutRule(ctx, admin, control.Rule{ID: "x", Spec: []byte("[1]")}, 0, "")
			return err
		}()},
		{"validate", "spec.limit", func() error { _, _, err := p.PutRule(ctx, admin, rule("bad", 1), 0, ""); return err }()},
		{"override expiry", "expires_at", func() error {
			_, err := p.PutOverride(ctx, admin, control.Override{Kind: "user", Value: "u", Limits: map[string]control.LimitSpec{"api": {Limit: 1}}, ExpiresAt: now.Add(-time.Second), Reason: "r"})
			return err
		}()},
		{"override reason", "reason", func() error {
			_, err := p.PutOverride(ctx, admin, control.Override{Kind: "user", Value: "u", Limits: map[string]control.LimitSpec{"api": {Limit: 1}}, ExpiresAt: now.Add(time.Hour)})
			return err
		}()},
		{"override window", "limits.api.window", func() error {
			_, err := p.PutOverride(ctx, admin, control.Override{Kind: "user", Value: "u", Limits: map[string]control.LimitSpec{"api": {Window: "soon"}}, ExpiresAt: now.Add(time.Hour), Reason: "r"})
			return err
		}()},
		{"throttle percent", "reduction_percent", func() error {
			_, err := p.PutThrottle(ctx, admin, control.Throttle{Scope: "global", ReductionPercent: 101, Duration: time.Minute, Reason: "r"})
			return err
		}()},
		{"throttle target", "target", func() error {
			_, err := p.PutThrottle(ctx, admin, control.Throttle{Scope: "region", ReductionPercent: 50, Duration: time.Minute, Reason: "r"})
			return err
		}()},
		{"throttle duration", "duration", func() error {
			_, err := p.PutThrottle(ctx, admin, control.Throttle{Scope: "global", ReductionPercent: 50, Reason: "r"})
			return err
		}()},
		{"tier kind", "kind", func() error {
			_, err := p.SetTier(ctx, admin, control.Identity{Kind: "ip", Value: "1.2.3.4", Tier: "gold"}, 0, "")
			return err
		}()},
	} {
		var fe *control.FieldError
		if !errors.As(tc.err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want a *FieldError on %s", tc.name, tc.err, tc.field)
		}
	}
	if rs, _ := p.Rules(ctx); len(rs) != 0 {
		t.Errorf("after bad input: %d rules written", len(rs))
	}
	if es, _ := p.Audit(ctx, control.AuditFilter{}); len(es) != 0 {
		t.Errorf("after bad input: %d audit entries", len(es))
	}
}

func TestRacingWriters(t *testing.T) {
	ctx := context.Background()
	p := openFile(t, control.Options{})
	if _, _, err := p.PutRule(ctx, admin, rule("api", 1), 0, ""); err != nil {
		t.Fatal(err)
	}
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { _, _, errs[i] = p.PutRule(ctx, admin, rule("api", 100+i), 1, "race") })
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		var ce *control.ConflictError
		switch {
		case err == nil:
			won++
		case !errors.As(err, &ce) || ce.Current != 2:
			t.Errorf("loser: %v, want a *ConflictError at 2", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d writers won, want 1", won)
	}
	// Writers naming no version all land, one after the other.
	for i := range n {
		wg.Go(func() { _, _, errs[i] = p.PutRule(ctx, admin, rule("api", 200+i), 0, "") })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("unconditional write: %v", err)
		}
	}
	if r, _ := p.Rule(ctx, "api"); r.Version != 2+n {
		t.Errorf("version %d after %d more writes, want %d (no update lost)", r.Version, n, 2+n)
	}
}

func TestAudit(t *testing.T) {
	ctx := context.Background()
	var seen []control.AuditEntry
	var mu sync.Mutex
	p := openFile(t, control.Options{Audit: func(e control.AuditEntry) { mu.Lock(); seen = append(seen, e); mu.Unlock() }})
	p.PutRule(ctx, admin, rule("api", 1), 0, "make it")
	p.PutRule(ctx, admin, rule("api", 2), 0, "raise it")
	p.SetTier(ctx, control.Actor{Name: "bob", Role: control.RoleOperator}, control.Identity{Kind: "user", Value: "u/1", Tier: "gold"}, 0, "vip")
	p.DeleteRule(ctx, admin, "api", 0, "drop it")
	es, err := p.Audit(ctx, control.AuditFilter{Object: "rule"})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		action, reason string
		version        int64
		before, after  bool
	}{{"delete", "drop it", 2, true, false}, {"update", "raise it", 2, true, true}, {"create", "make it", 1, false, true}}
	if len(es) != len(want) {
		t.Fatalf("%d rule entries, want %d: %+v", len(es), len(want), es)
	}
	for i, w := range want {
		e := es[i]
		if e.Action != w.action || e.Reason != w.reason || e.Version != w.version || (e.Before != nil) != w.before || (e.After != nil) != w.after || e.Actor != admin || e.Revision == 0 {
			t.Errorf("entry %d: %+v, want %+v", i, e, w)
		}
	}
	if es, _ := p.Audit(ctx, control.AuditFilter{Actor: "bob"}); len(es) != 1 || es[0].ID != "user:u/1" {
		t.Errorf("bob's entries: %+v", es)
	}
	if es, _ := p.Audit(ctx, control.AuditFilter{Limit: 2}); len(es) != 2 || es[0].Action != "delete" {
		t.Errorf("limit 2: %+v", es)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 4 {
		t.Errorf("Audit hook saw %d entries, want 4", len(seen))
	}
	if id, err := p.Identity(ctx, "user", "u/1"); err != nil || id.Tier != "gold" || id.Version != 1 {
		t.Errorf("Identity: %+v %v", id, err)
	}
}

// TestExpiry: the layer is applied again, without the override and the
// throttle, when they expire.
func TestExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := newLayers()
		s, err := filestore.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		p, err := control.Open(ctx, control.Options{Backend: s, Apply: l.apply, Region: "eu"})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, err := p.PutOverride(ctx, admin, control.Override{Kind: "client", Value: "c1", Limits: map[string]control.LimitSpec{"api": {Limit: 5, Window: "1m"}},
			ExpiresAt: time.Now().Add(time.Minute), Reason: "launch"}); err != nil {
			t.Fatal(err)
		}
		th, err := p.PutThrottle(ctx, admin, control.Throttle{Scope: "region", Target: "eu", ReductionPercent: 50, Duration: 2 * time.Minute, Reason: "incident"})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		x := l.last()
		if len(x.Overrides) != 1 || len(x.Throttles) != 1 || x.Overrides[0].Limits["api"].Window != time.Minute || x.Region != "eu" {
			t.Fatalf("layer %+v, want the override and the throttle", x)
		}
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		if x := l.last(); len(x.Overrides) != 0 || len(x.Throttles) != 1 {
			t.Fatalf("after a minute: %+v, want the throttle only", x)
		}
		if os, _ := p.Overrides(ctx, "", ""); len(os) != 0 {
			t.Errorf("Overrides lists %d expired", len(os))
		}
		if _, err := p.LiftThrottle(ctx, admin, th.ID, "over"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if x := l.last(); len(x.Throttles) != 0 {
			t.Fatalf("after lifting: %+v, want no throttle", x)
		}
		if ts, _ := p.Throttles(ctx); len(ts) != 0 {
			t.Errorf("Throttles lists %d lifted", len(ts))
		}
		if _, err := p.LiftThrottle(ctx, admin, th.ID, "again"); !errors.Is(err, control.ErrNotFound) {
			t.Errorf("lifting again: %v, want ErrNotFound", err)
		}
	})
}

// TestCache: a Plane opened on a store it cannot reach applies the layer
// the last one cached.
func TestCache(t *testing.T) {
	ctx := context.Background()
	cache := t.TempDir()
	s, err := filestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l := newLayers()
	p, err := control.Open(ctx, control.Options{Backend: s, CacheDir: cache, Apply: l.apply})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.PutRule(ctx, admin, rule("api", 7), 0, ""); err != nil {
		t.Fatal(err)
	}
	l.waitFor(t, "the rule", func(x *policy.Layer) bool { return len(x.Rules) == 1 })
	p.Close()
	s.Close() // the store is gone
	if _, _, err := p.PutRule(ctx, admin, rule("api", 8), 0, ""); !errors.Is(err, control.ErrUnavailable) {
		t.Errorf("write with the store gone: %v, want ErrUnavailable", err)
	}
	l2 := newLayers()
	p2, err := control.Open(ctx, control.Options{Backend: s, CacheDir: cache, Apply: l2.apply})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if x := l2.last(); x == nil || len(x.Rules) != 1 || x.Rules[0].ID != "api" {
		t.Fatalf("cached layer %+v, want rule api", x)
	}
	if st := p2.Status(); st.Reachable || !st.FromCache || st.Revision == 0 {
		t.Errorf("status %+v, want unreachable, from the cache", st)
	}
}
