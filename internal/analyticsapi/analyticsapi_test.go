package analyticsapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/analytics"
)

// downStore is a store that never answers, as PostgreSQL down.
type downStore struct{}

func (downStore) Query(context.Context, analytics.Filter) (analytics.Result, error) {
	return analytics.Result{}, errors.New("pganalytics: dial tcp postgres://u:secret@db: refused")
}

func serve(t *testing.T, cfg Config, method, target string) (int, string) {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return now }
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec.Code, rec.Body.String()
}

// TestHandler: the answer's shape (empty lists, not null), its source and
// gaps; 400 naming the field, 405, and a store that fails: 503 without a
// fallback, the fallback's answer with one, never the store's error text.
func TestHandler(t *testing.T) {
	mem := analytics.NewMemory(analytics.MemoryConfig{Retention: 1 << 62})
	mem.Add(now, []analytics.Rollup{{Key: analytics.Key{Minute: now.Add(-2 * time.Minute).Truncate(time.Minute).Unix(), Client: "c", Resource: "/r", Region: "eu", Blocked: true}, Requests: 3, Cost: 3, LatencySumUS: 30}})
	minute := now.Add(-2 * time.Minute).Truncate(time.Minute).UTC()
	mem.AddChanges(now, []analytics.Change{{Time: minute, Kind: "control_plane_change", Detail: "create throttle t1"}})
	mem.AddAnomalies(now, []analytics.Anomaly{{Kind: analytics.AnomalyRequests, Client: "c", Resource: "/r", Region: "eu", Minute: minute.Unix(), Observed: 1000, Baseline: 100}})
	gaps := func() Gaps { return Gaps{EventsDropped: 2, SinkDroppedRows: 5} }

	code, body := serve(t, Config{Store: mem, Gaps: gaps}, "GET", "/api/v1/analytics")
	var a map[string]any
	if err := json.Unmarshal([]byte(body), &a); code != 200 || err != nil {
		t.Fatalf("%d %s", code, body)
	}
	for _, k := range []string{"start_time", "end_time", "granularity", "summary", "by_region", "time_series", "top_clients", "top_resources", "by_resource", "anomalies_detected", "changes", "gaps", "source"} {
		if _, ok := a[k]; !ok {
			t.Errorf("answer lacks %s: %s", k, body)
		}
	}
	if !strings.Contains(body, `"summary":{"total_requests":3,"allowed":0,"blocked":3,"block_rate":1,"avg_latency_us":10,`) ||
		!strings.Contains(body, `"gaps":{"events_dropped":2,"sink_dropped_rows":5,"sink_healthy":false}`) ||
		!strings.Contains(body, `"source":"memory"`) {
		t.Errorf("answer: %s", body)
	}
	if !strings.Contains(body, `"by_resource":[{"resource":"/r","total_requests":3,"allowed":0,"blocked":3}]`) ||
		!strings.Contains(body, `"anomalies_detected":[{"time":"`+minute.Format(time.RFC3339)+`","kind":"requests_spike","client_id":"c","resource":"/r","region":"eu","observed":1000,"baseline":100}]`) ||
		!strings.Contains(body, `"changes":[{"time":"`+minute.Format(time.RFC3339)+`","kind":"control_plane_change","detail":"create throttle t1"}]`) {
		t.Errorf("lists: %s", body)
	}
	if code, body := serve(t, Config{Store: mem}, "GET", "/api/v1/analytics?client_id=nobody"); code != 200 ||
		!strings.Contains(body, `"by_region":[],"time_series":[],"top_clients":[],"top_resources":[],"by_resource":[],"anomalies_detected":[],"changes":[{`) {
		t.Errorf("no checks: %d %s", code, body)
	}
	if code, body := serve(t, Config{Store: mem}, "GET", "/api/v1/analytics?granularity=week"); code != 400 ||
		!strings.Contains(body, `"error":"invalid_request","field":"granularity"`) {
		t.Errorf("bad granularity: %d %s", code, body)
	}
	if code, _ := serve(t, Config{Store: mem}, "DELETE", "/api/v1/analytics"); code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: %d", code)
	}
	if code, body := serve(t, Config{Store: downStore{}, Source: "postgres"}, "GET", "/api/v1/analytics"); code != 503 || strings.Contains(body, "secret") {
		t.Errorf("store down: %d %s", code, body)
	}
	if code, body := serve(t, Config{Store: downStore{}, Source: "postgres", Fallback: mem}, "GET", "/api/v1/analytics"); code != 200 ||
		!strings.Contains(body, `"source":"memory"`) || !strings.Contains(body, `"total_requests":3`) {
		t.Errorf("store down, with a fallback: %d %s", code, body)
	}
}
