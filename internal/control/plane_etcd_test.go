package control_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/control/etcdstore"
	"github.com/sluicehq/sluice/internal/control/etcdtest"
	"github.com/sluicehq/sluice/internal/policy"
)

var etcd *etcdtest.Server

func TestMain(m *testing.M) {
	s, err := etcdtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	etcd = s
	code := m.Run()
	s.Close()
	os.Exit(code)
}

// openEtcd opens a Plane named name on the store under prefix.
func openEtcd(t *testing.T, prefix, name, cache string, l *layers) *control.Plane {
	t.Helper()
	s, err := etcdstore.Open(etcdstore.Options{Endpoints: []string{etcd.Endpoint()}, Prefix: prefix, DialTimeout: time.Second, RequestTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p, err := control.Open(context.Background(), control.Options{Backend: s, Instance: name, CacheDir: cache, Apply: l.apply})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); s.Close() })
	return p
}

func hasRule(id string) func(*policy.Layer) bool {
	return func(x *policy.Layer) bool {
		for _, r := range x.Rules {
			if r.ID == id {
				return true
			}
		}
		return false
	}
}

func TestConfigPropagation(t *testing.T) {
	ctx := context.Background()
	prefix := etcd.Prefix()
	la, lb := newLayers(), newLayers()
	a := openEtcd(t, prefix, "a", "", la)
	openEtcd(t, prefix, "b", "", lb)
	c := control.Config{ID: "c1", ClientID: "acme", Resource: "/search", Algorithm: "token_bucket", BaseRate: 10, BurstCapacity: 20}
	got, created, err := a.PutConfig(ctx, admin, c, 0)
	if err != nil || !created || got.Version != 1 {
		t.Fatalf("PutConfig: %+v %v %v", got, created, err)
	}
	c.BaseRate = 50
	if _, _, err := a.PutConfig(ctx, admin, c, 1); err != nil {
		t.Fatal(err)
	}
	var ce *control.ConflictError
	if _, _, err := a.PutConfig(ctx, admin, c, 1); !errors.As(err, &ce) || ce.Current != 2 {
		t.Errorf("stale PutConfig: %v, want a *ConflictError at 2", err)
	}
	lb.waitFor(t, "config-c1", hasRule("config-c1"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := a.Config(ctx, "c1")
		if err != nil {
			t.Fatal(err)
		}
		if st.PropagationStatus == control.PropagationApplied {
			if st.Config.BaseRate != 50 || st.Config.Version != 2 || len(st.Lagging) != 0 {
				t.Errorf("config state %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s after 10s, lagging %+v", st.PropagationStatus, st.Lagging)
		}
		time.Sleep(20 * time.Millisecond)
	}
	insts, err := a.Instances(ctx)
	if err != nil || len(insts) != 2 {
		t.Errorf("Instances: %+v %v, want a and b", insts, err)
	}
	back, err := a.RollbackConfig(ctx, admin, "c1", 1, "too high")
	if err != nil || back.Version != 3 || back.BaseRate != 10 {
		t.Fatalf("RollbackConfig: %+v %v, want version 3 with base_rate 10", back, err)
	}
	vs, err := a.ConfigVersions(ctx, "c1")
	if err != nil || len(vs) != 3 || vs[0].BaseRate != 10 || vs[1].BaseRate != 50 || vs[2].BaseRate != 10 {
		t.Errorf("ConfigVersions: %+v %v", vs, err)
	}
	es, _ := a.Audit(ctx, control.AuditFilter{Object: "config"})
	if len(es) != 3 || es[0].Action != "rollback" || es[0].Reason != "too high" {
		t.Errorf("config audit: %+v", es)
	}
	x := lb.waitFor(t, "config-c1 v3", func(x *policy.Layer) bool {
		for _, r := range x.Rules {
			if r.ID == "config-c1" && r.Version == 3 {
				return true
			}
		}
		return false
	})
	for _, r := range x.Rules {
		if r.ID == "config-c1" {
			want := `{"algorithm":"token_bucket","burst":20,"dimension":"client","id":"config-c1","limit":10,"match":{"client":["acme"],"resource":"/search"},"window":"1s"}`
			if string(r.Spec) != want {
				t.Errorf("rule %s\nwant %s", r.Spec, want)
			}
		}
	}
}

// TestOutage: with etcd down writes fail and every instance keeps its
// layer; a new instance applies the cached one; when etcd is back, a
// change made by another instance reaches them all.
func TestOutage(t *testing.T) {
	ctx := context.Background()
	prefix := etcd.Prefix()
	cache := t.TempDir()
	la, lb := newLayers(), newLayers()
	a := openEtcd(t, prefix, "a", cache, la)
	b := openEtcd(t, prefix, "b", "", lb)
	if _, _, err := a.PutRule(ctx, admin, rule("r1", 1), 0, ""); err != nil {
		t.Fatal(err)
	}
	la.waitFor(t, "r1", hasRule("r1"))
	lb.waitFor(t, "r1", hasRule("r1"))

	etcd.Stop()
	restarted := false
	defer func() {
		if !restarted {
			etcd.Start()
		}
	}()
	if _, _, err := a.PutRule(ctx, admin, rule("r2", 1), 0, ""); !errors.Is(err, control.ErrUnavailable) {
		t.Errorf("write with etcd down: %v, want ErrUnavailable", err)
	}
	if !hasRule("r1")(la.last()) {
		t.Errorf("a's layer lost r1: %+v", la.last())
	}
	lc := newLayers()
	c := openEtcd(t, prefix, "c", cache, lc)
	if x := lc.last(); x == nil || !hasRule("r1")(x) {
		t.Fatalf("new instance with etcd down: %+v, want the cached layer with r1", x)
	}
	if st := c.Status(); st.Reachable || !st.FromCache {
		t.Errorf("status %+v, want unreachable, from the cache", st)
	}

	if err := etcd.Start(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, _, err := b.PutRule(ctx, admin, rule("r3", 1), 0, "after the outage")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("write after etcd restarted: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for name, l := range map[string]*layers{"a": la, "b": lb, "c": lc} {
		x := l.waitFor(t, name+": r3", hasRule("r3"))
		if !hasRule("r1")(x) {
			t.Errorf("%s: layer %+v, want r1 and r3", name, x)
		}
	}
}
