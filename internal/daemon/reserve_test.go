package daemon_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

func del(t *testing.T, url string) *response {
	t.Helper()
	req, err := http.NewRequest("DELETE", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return read(t, resp)
}

// TestReservations runs a reservation through the daemon on the memory
// store: granted, drawn by checks, released, and its events logged.
func TestReservations(t *testing.T) {
	td := start(t, `version: 1
rules:
  - {id: orders, match: {resource: "/api/orders"}, limit: 5, window: 1m, algorithm: fixed_window}
`)
	r := post(t, td.base+"/api/v1/reserve", `{"client_id":"a","resource":"/api/orders","tokens_needed":3,"duration_seconds":30}`)
	if r.status != 200 || r.num("tokens_reserved") != 3 {
		t.Fatalf("reserve: %d %s", r.status, r.raw)
	}
	id := r.str("reservation_id")
	// Three checks draw from the reservation; the limit of 5 stays whole
	// for the checks without one.
	for i := range 3 {
		c := post(t, td.base+"/api/v1/check", `{"client_id":"a","resource":"/api/orders","reservation_id":"`+id+`"}`)
		if c.status != 200 || c.str("source") != "reservation" || c.num("remaining") != int64(2-i) {
			t.Fatalf("check %d with the reservation: %d %s", i, c.status, c.raw)
		}
	}
	for i := range 5 {
		if c := post(t, td.base+"/api/v1/check", `{"client_id":"a","resource":"/api/orders"}`); c.status != 200 {
			t.Fatalf("check %d without: %d %s", i, c.status, c.raw)
		}
	}
	if c := post(t, td.base+"/api/v1/check", `{"client_id":"b","resource":"/api/orders","reservation_id":"`+id+`"}`); c.status != 403 {
		t.Errorf("another client's reservation: %d %s", c.status, c.raw)
	}
	if d := del(t, td.base+"/api/v1/reserve/"+id); d.status != 200 || d.num("tokens_returned") != 0 {
		t.Errorf("release: %d %s", d.status, d.raw)
	}
	if d := del(t, td.base+"/api/v1/reserve/"+id); d.status != 404 {
		t.Errorf("second release: %d %s", d.status, d.raw)
	}
	r = post(t, td.base+"/api/v1/reserve", `{"client_id":"a","resource":"/api/orders","tokens_needed":6,"duration_seconds":30}`)
	if r.status != 400 || r.str("field") != "tokens_needed" {
		t.Errorf("above the limit: %d %s", r.status, r.raw)
	}
	// The used tokens come back at expiry, which the sweep reports.
	td.clock.Advance(31 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		ev := get(t, td.base+"/api/v1/events?type=reservation_expired")
		if evs, _ := ev.body["events"].([]any); len(evs) == 1 {
			if e := evs[0].(map[string]any); e["reservation_id"] != id || e["tokens"] != 3.0 {
				t.Errorf("expiry event %v", e)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no expiry event: %s", ev.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, typ := range []string{"reservation_granted", "reservation_released"} {
		if ev := get(t, td.base+"/api/v1/events?type="+typ); len(ev.body["events"].([]any)) != 1 {
			t.Errorf("%s events: %s", typ, ev.raw)
		}
	}
}

// TestReservationsAcrossInstances runs a reservation through two daemons
// on one Redis: reserved on one, queued and granted there, drawn from and
// released on the other, and its tokens back in the pool both see.
func TestReservationsAcrossInstances(t *testing.T) {
	cfg := `version: 1
rules:
  - {id: orders, match: {resource: "/api/orders"}, limit: 5, window: 1m, algorithm: fixed_window}
`
	url := "redis://" + redistest.Start(t).Addr
	onRedis := func(c *daemon.Config) { c.StoreURL = url }
	one, two := start(t, cfg, onRedis), start(t, cfg, onRedis)
	r := post(t, one.base+"/api/v1/reserve", `{"client_id":"a","resource":"/api/orders","tokens_needed":4,"duration_seconds":30}`)
	if r.status != 200 {
		t.Fatalf("reserve on one: %d %s", r.status, r.raw)
	}
	id := r.str("reservation_id")
	q := post(t, two.base+"/api/v1/reserve", `{"client_id":"b","resource":"/api/orders","tokens_needed":3,"duration_seconds":30}`)
	if q.status != 202 || q.num("position_in_queue") != 1 {
		t.Fatalf("reserve on two, beyond the pool: %d %s", q.status, q.raw)
	}
	if c := post(t, two.base+"/api/v1/check", `{"client_id":"a","resource":"/api/orders","reservation_id":"`+id+`"}`); c.status != 200 || c.num("remaining") != 3 {
		t.Fatalf("check on two with one's reservation: %d %s", c.status, c.raw)
	}
	if d := del(t, two.base+"/api/v1/reserve/"+id); d.status != 200 || d.num("tokens_returned") != 3 {
		t.Fatalf("release on two: %d %s", d.status, d.raw)
	}
	if d := del(t, one.base+"/api/v1/reserve/"+id); d.status != 404 {
		t.Errorf("second release, on one: %d %s", d.status, d.raw)
	}
	qid := q.str("reservation_id")
	if g := get(t, one.base+"/api/v1/reserve/"+qid); g.status != 200 || g.str("status") != "granted" {
		t.Errorf("b's request, read on one after the release: %d %s", g.status, g.raw)
	}
}

func TestReservationsOff(t *testing.T) {
	td := start(t, "", func(c *daemon.Config) { c.NoReservations = true })
	if r := post(t, td.base+"/api/v1/reserve", `{}`); r.status != 404 {
		t.Errorf("reserve with reservations off: %d %s", r.status, r.raw)
	}
}

// TestReservationQuotasThroughAdminAPI writes a rule with reservations
// through the admin API: a bad quota is a 400 naming its field; a good one
// sets the pool's queue limit and the client's burst.
func TestReservationQuotasThroughAdminAPI(t *testing.T) {
	const token = "sk_test_reservations_0123456789abcdef"
	td := start(t, "version: 1\n", func(c *daemon.Config) {
		c.DataDir = t.TempDir()
		c.AdminToken = token
	})
	bad := `{"match":{"resource":"/bulk"},"limit":10,"window":"1s","reservations":{"quotas":[{"client":"a","weight":0}]}}`
	status, body := adminDo(t, "PUT", td.base+"/api/v1/rules/bulk", token, bad)
	if status != 400 || !strings.Contains(body, `"field":"reservations.quotas[0].weight"`) {
		t.Fatalf("bad quota: %d %s; want 400 naming reservations.quotas[0].weight", status, body)
	}
	good := `{"match":{"resource":"/bulk"},"limit":10,"window":"1s","reservations":{"queue_limit":1,` +
		`"quotas":[{"client":"a","max_burst":4},{"client":"*","weight":2}]}}`
	if status, body := adminDo(t, "PUT", td.base+"/api/v1/rules/bulk", token, good); status/100 != 2 {
		t.Fatalf("good rule: %d %s", status, body)
	}
	reserve := func(client string, tokens int) *response {
		return post(t, td.base+"/api/v1/reserve",
			`{"client_id":"`+client+`","resource":"/bulk","tokens_needed":`+strconv.Itoa(tokens)+`,"duration_seconds":30}`)
	}
	// The control plane applies the rule a moment after the write.
	deadline := time.Now().Add(5 * time.Second)
	for r := reserve("a", 5); r.status != 400 || r.str("field") != "tokens_needed"; r = reserve("a", 5) {
		if time.Now().After(deadline) {
			t.Fatalf("5 tokens above a's max_burst of 4: %d %s", r.status, r.raw)
		}
		if r.status == 200 || r.status == 202 {
			del(t, td.base+"/api/v1/reserve/"+r.str("reservation_id"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := reserve("b", 10); r.status != 200 {
		t.Fatalf("b takes the pool: %d %s", r.status, r.raw)
	}
	if r := reserve("c", 1); r.status != 202 {
		t.Fatalf("c queued: %d %s", r.status, r.raw)
	}
	if r := reserve("d", 1); r.status != 429 || r.str("error") != "queue_full" {
		t.Errorf("beyond queue_limit 1: %d %s; want 429 queue_full", r.status, r.raw)
	}
}
