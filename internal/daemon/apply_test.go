package daemon_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/policy"
)

// goodPolicy is the last good configuration of TestApplyIsWholeOrNothing:
// its tier is the limit of the control plane's tiered rule.
const goodPolicy = `version: 1
default_tier: free
tiers:
  free: { limit: 10, window: 1m }
rules:
  - id: api
    match: { resource: "/api/*" }
    dimension: user
    limit: 5
    window: 1m
`

// tierlessPolicy is valid on its own, but has no tiers: a tiered rule of
// the control plane's does not apply over it.
const tierlessPolicy = `version: 1
rules:
  - id: api
    match: { resource: "/api/*" }
    dimension: user
    limit: 7
    window: 1m
`

// TestApplyIsWholeOrNothing applies, through Reload and through Apply, a
// configuration file that the policy parser accepts but a later stage
// refuses: the control plane's layer does not apply over it. Nothing of it
// may be in force afterwards: not its limits, not its version in the
// status or the policy summary, and not as the file under the layer,
// which the next change of the control plane must still apply over.
func TestApplyIsWholeOrNothing(t *testing.T) {
	const token = "slc_apply_whole_or_nothing_0123456789"
	td := start(t, goodPolicy, func(c *daemon.Config) {
		c.DataDir = t.TempDir()
		c.AdminToken = token
		c.WatchDebounce = time.Hour // the test reloads
	})
	putRule := func(id, body string) {
		t.Helper()
		if status, resp := adminDo(t, "PUT", td.base+"/api/v1/rules/"+id, token, body); status/100 != 2 {
			t.Fatalf("PUT rule %s: %d %s", id, status, resp)
		}
	}
	putRule("extra", `{"match":{"resource":"/extra"},"dimension":"user","tiered":true}`)
	if _, ok := waitFor(5*time.Second, func() bool { return limitOf(t, td, "c", "u", "/extra") == 10 }); !ok {
		t.Fatal("the control plane's tiered rule never applied")
	}
	before := td.ConfigStatus()

	bad, err := policy.Parse("tierless.yaml", []byte(tierlessPolicy))
	if err != nil {
		t.Fatalf("the policy parser refuses the file the test needs it to accept: %v", err)
	}
	if err := os.WriteFile(td.path, []byte(tierlessPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, apply := range map[string]func() error{"Reload": td.Reload, "Apply": func() error { return td.Apply(bad) }} {
		err := apply()
		if err == nil || !strings.Contains(err.Error(), "tier") {
			t.Fatalf("%s of a file the control plane's layer does not apply over: %v, want an error about the tier", name, err)
		}
		if got := limitOf(t, td, "c", "u", "/api/x"); got != 5 {
			t.Errorf("after %s: the file's rule limits %d, want 5 (the last good file's)", name, got)
		}
		if got := limitOf(t, td, "c", "u", "/extra"); got != 10 {
			t.Errorf("after %s: the layer's rule limits %d, want 10", name, got)
		}
		st := td.ConfigStatus()
		if st.Version != before.Version || st.Reloads != before.Reloads || st.LastError == "" {
			t.Errorf("after %s: status %+v, want version %q, %d loads and the error", name, st, before.Version, before.Reloads)
		}
		status, p, raw := getPolicy(t, td.base, token)
		if status != http.StatusOK || p.Version != before.Version || len(p.Tiers) != 1 || len(p.Rules) != 2 {
			t.Errorf("after %s: policy summary %d %s, want the last good file's version, tier and rules", name, status, raw)
		}
	}
	if r := get(t, td.base+"/metrics"); !strings.Contains(r.raw, "sluice_config_last_reload_successful 0") {
		t.Error("the metrics do not show the refused configuration")
	}

	// The control plane's next change applies over the last good file: had
	// the refused one been kept as the file, this change would not apply
	// either (the tiered rule stays in the layer).
	putRule("more", `{"match":{"resource":"/more"},"dimension":"user","limit":1234,"window":"1m"}`)
	if _, ok := waitFor(5*time.Second, func() bool { return limitOf(t, td, "c", "u", "/more") == 1234 }); !ok {
		t.Fatal("the control plane's change after the refused file never applied")
	}
	if got := limitOf(t, td, "c", "u", "/api/x"); got != 5 {
		t.Errorf("after the control plane's change: the file's rule limits %d, want 5", got)
	}

	// A good file applies, and clears the error.
	if err := os.WriteFile(td.path, []byte(strings.Replace(goodPolicy, "limit: 5", "limit: 6", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := td.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(t, td, "c", "u", "/api/x"); got != 6 {
		t.Errorf("after a good file: limit %d, want 6", got)
	}
	if st := td.ConfigStatus(); st.LastError != "" {
		t.Errorf("after a good file: status %+v, want no error", st)
	}
}

// TestApplyIsSeenWhole applies two configurations in turn while the
// policy summary is read: each answer must be one configuration, never
// the version of one with the assignments of the other.
func TestApplyIsSeenWhole(t *testing.T) {
	td := start(t, "version: 1\n", func(c *daemon.Config) { c.WatchDebounce = time.Hour })
	policies := make([]*policy.Policy, 2)
	clientOf := map[string]string{} // of each version
	for i := range policies {
		text := fmt.Sprintf("version: 1\n# %d\nassignments:\n  - { client: c%d, limits: { r: { limit: 5 } } }\n"+
			"rules:\n  - { id: r, match: { resource: /r }, limit: 1, window: 1m }\n", i, i)
		p, err := policy.Parse("p.yaml", []byte(text))
		if err != nil {
			t.Fatal(err)
		}
		policies[i] = p
		clientOf[p.Version] = fmt.Sprintf("c%d", i)
	}
	if len(clientOf) != 2 {
		t.Fatalf("the two policies have one version: %v", clientOf)
	}
	first := td.ConfigStatus().Version
	var stop atomic.Bool
	var reads atomic.Int64
	errs := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			resp, err := http.Get(td.base + "/api/v1/policy")
			if err != nil {
				errs <- err.Error()
				return
			}
			var p struct {
				Version   string `json:"version"`
				Overrides []struct{ Value string }
			}
			err = json.NewDecoder(resp.Body).Decode(&p)
			resp.Body.Close()
			switch {
			case err != nil:
				errs <- err.Error()
				return
			case p.Version == first: // the first file, before any apply
			case len(p.Overrides) != 1 || p.Overrides[0].Value != clientOf[p.Version]:
				errs <- fmt.Sprintf("version %s with the assignments %+v", p.Version, p.Overrides)
				return
			}
			reads.Add(1)
		}
	})
	for i := 0; i < 1000 && len(errs) == 0; i++ {
		if err := td.Apply(policies[i%2]); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	select {
	case e := <-errs:
		t.Fatal(e)
	default:
	}
	t.Logf("%d summaries read during 1000 applies", reads.Load())
}
