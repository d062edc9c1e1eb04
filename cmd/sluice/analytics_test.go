package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/analytics/pgtest"
)

// TestMigrate: `sluice migrate` applies the analytics schema once, from
// the flag or from SLUICE_ANALYTICS, and says so.
func TestMigrate(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"migrate"}, &out, &errOut, noEnv); code != 2 || !strings.Contains(errOut.String(), "Usage") {
		t.Errorf("without a URL: exit %d, %q", code, errOut.String())
	}
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url := srv.NewDatabase(t)
	out.Reset()
	if code := run([]string{"migrate", "--analytics", url}, &out, &errOut, noEnv); code != 0 || !strings.Contains(out.String(), "applied migrations [1 2 3") {
		t.Errorf("first run: exit %d, %q, %q", code, out.String(), errOut.String())
	}
	out.Reset()
	env := func(k string) string {
		if k == "SLUICE_ANALYTICS" {
			return url
		}
		return ""
	}
	if code := run([]string{"migrate"}, &out, &errOut, env); code != 0 || !strings.Contains(out.String(), "current") {
		t.Errorf("second run, from the environment: exit %d, %q, %q", code, out.String(), errOut.String())
	}
}
