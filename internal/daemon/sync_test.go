package daemon_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/globalsync/natstest"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// natsSrv is one NATS server for the package's tests, started by the
// first test that needs it.
var natsSrv struct {
	once sync.Once
	srv  *natstest.Server
	err  error
}

func natsServer(t *testing.T) *natstest.Server {
	t.Helper()
	natsSrv.once.Do(func() { natsSrv.srv, natsSrv.err = natstest.Start() })
	if natsSrv.err != nil {
		t.Fatal(natsSrv.err)
	}
	return natsSrv.srv
}

const syncPolicy = `version: 1
rules:
  - { id: partner, match: { resource: /partner }, dimension: client, limit: 100, window: 1m, global_limit: 4 }
`

// Two regions on one NATS: what one admits of a global limit comes off
// what the other may admit; GET /internal/sync and the metrics show the
// peer.
func TestSyncBetweenRegions(t *testing.T) {
	srv := natsServer(t)
	region := func(name, peer string) *testDaemon {
		return start(t, syncPolicy, func(c *daemon.Config) { c.Region, c.SyncURL, c.SyncPeers = name, srv.URL(), []string{peer} })
	}
	eu, us := region("eu", "us"), region("us", "eu")
	// Until a peer is heard from, it counts at its share (2 of 4).
	for _, d := range []*testDaemon{eu, us} {
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(get(t, d.base+"/internal/sync").raw, `"last_sync":"`); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the regions never heard each other: %s", get(t, d.base+"/internal/sync").raw)
			}
		}
	}
	// eu takes 3: at most its part of what is left at a time (half of
	// it, with two regions heard), the rest once us has seen its count.
	for n, deadline := 0, time.Now().Add(10*time.Second); n < 3; time.Sleep(5 * time.Millisecond) {
		r := post(t, eu.base+"/api/v1/check", `{"client_id":"acme","resource":"/partner"}`)
		if r.status == 200 {
			n++
		} else if r.status != 429 || time.Now().After(deadline) {
			t.Fatalf("eu, check %d: %d %s", n, r.status, r.raw)
		}
	}
	// us learns of eu's 3 within the sync's lag: at most 1 is left (less
	// while eu's reserve lasts), then the 1 once eu is seen idle.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := post(t, us.base+"/api/v1/check", `{"client_id":"acme","resource":"/partner","cost":0}`)
		if r.num("global_remaining") <= 1 {
			if h := r.header.Get("X-Ratelimit-Global-Remaining"); h != r.str("global_remaining") && h != "0" && h != "1" {
				t.Errorf("us: %s, X-RateLimit-Global-Remaining %q", r.raw, h)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("us never saw eu's checks: %s", r.raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
	admitted := false
	for deadline := time.Now().Add(10 * time.Second); !admitted && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		r := post(t, us.base+"/api/v1/check", `{"client_id":"acme","resource":"/partner"}`)
		if r.status == 200 {
			admitted = true
		} else if r.status != 429 || r.str("error") != "global_limit_exceeded" || r.num("retry_after_ms") <= 0 {
			t.Fatalf("us, within the global limit: %d %s", r.status, r.raw)
		}
	}
	if !admitted {
		t.Fatal("us never admitted the fourth check")
	}
	r := post(t, us.base+"/api/v1/check", `{"client_id":"acme","resource":"/partner"}`)
	if r.status != 429 || r.str("error") != "global_limit_exceeded" || r.num("global_remaining") != 0 {
		t.Errorf("us, over the global limit: %d %s", r.status, r.raw)
	}

	st := get(t, us.base+"/internal/sync")
	peers, _ := st.body["peers"].([]any)
	if st.status != 200 || st.str("region") != "us" || len(peers) != 1 || !strings.Contains(st.raw, `"region":"eu"`) || !strings.Contains(st.raw, `"sync_lag_ms"`) {
		t.Errorf("GET /internal/sync: %d %s", st.status, st.raw)
	}
	m := get(t, us.base+"/metrics")
	for _, want := range []string{`sluice_sync_lag_ms{peer="eu"}`, "sluice_sync_connected 1", "sluice_sync_pending_events"} {
		if !strings.Contains(m.raw, want) {
			t.Errorf("metrics without %s", want)
		}
	}
}

func TestSyncOff(t *testing.T) {
	d := start(t, syncPolicy)
	if r := get(t, d.base+"/internal/sync"); r.status != 404 || r.str("error") != "sync_disabled" {
		t.Errorf("GET /internal/sync without a sync: %d %s", r.status, r.raw)
	}
	// Alone, the global limit holds in this region's store.
	for i := range 5 {
		r := post(t, d.base+"/api/v1/check", `{"client_id":"acme","resource":"/partner"}`)
		if want := i < 4; (r.status == 200) != want {
			t.Errorf("check %d: %d %s", i, r.status, r.raw)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := daemon.Start(ctx, daemon.Config{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", SyncURL: "nats://127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "--region") {
		t.Errorf("a sync without a region: %v", err)
	}
}

// A rule with a global limit alone, in two regions: what eu admits comes
// off what us may admit, and gRPC's check and quota report the one global
// entry.
func TestSyncGlobalOnly(t *testing.T) {
	const pol = `version: 1
rules:
  - { id: shared, match: { resource: /shared }, dimension: client, window: 1m, global_limit: 4 }
`
	srv := natsServer(t)
	region := func(name, peer string) *testDaemon {
		return start(t, pol, func(c *daemon.Config) { c.Region, c.SyncURL, c.SyncPeers = name, srv.URL(), []string{peer} })
	}
	eu, us := region("eu", "us"), region("us", "eu")
	for _, d := range []*testDaemon{eu, us} {
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(get(t, d.base+"/internal/sync").raw, `"last_sync":"`); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the regions never heard each other: %s", get(t, d.base+"/internal/sync").raw)
			}
		}
	}
	for n, deadline := 0, time.Now().Add(10*time.Second); n < 3; time.Sleep(5 * time.Millisecond) {
		r := post(t, eu.base+"/api/v1/check", `{"client_id":"acme","resource":"/shared"}`)
		if r.status == 200 {
			n++
			if r.num("limit") != 4 || r.header.Get("X-Ratelimit-Limit") != "4" {
				t.Errorf("eu, check %d: %s, want the global limit of 4", n, r.raw)
			}
		} else if r.status != 429 || r.str("error") != "global_limit_exceeded" || time.Now().After(deadline) {
			t.Fatalf("eu, check %d: %d %s", n, r.status, r.raw)
		}
	}
	c := sluicev1.NewRateLimiterClient(dial(t, us.GRPCAddr()))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		q, err := c.GetRemainingQuota(ctx(t), &sluicev1.QuotaRequest{ClientId: "acme", Resource: "/shared"})
		if err != nil {
			t.Fatal(err)
		}
		rs := q.GetRules()
		if len(rs) != 1 || !rs[0].GetGlobal() || rs[0].GetLimit() != 4 {
			t.Fatalf("us, quota: %v, want the one global entry", q)
		}
		if rs[0].GetRemaining() <= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("us never saw eu's checks: %v", q)
		}
	}
	resp, err := c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "acme", Resource: "/shared"})
	for deadline := time.Now().Add(10 * time.Second); err == nil && !resp.GetAllowed() && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err = c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "acme", Resource: "/shared"})
	}
	if err != nil || !resp.GetAllowed() || len(resp.GetRules()) != 1 || !resp.GetRules()[0].GetGlobal() || resp.GetLimit() != 4 {
		t.Fatalf("us, the fourth check: %v, %v", resp, err)
	}
	resp, err = c.CheckRateLimit(ctx(t), &sluicev1.CheckRequest{ClientId: "acme", Resource: "/shared"})
	if err != nil || resp.GetAllowed() || resp.GetReason() != "global_limit_exceeded" || resp.GetGlobalRemaining() != 0 {
		t.Errorf("us, over the global limit: %v, %v", resp, err)
	}
}
