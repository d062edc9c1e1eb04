package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `sluice load` runs sluice-load from PATH with its arguments, unparsed,
// and exits with its code; without one it says how to get it, and its
// --help still exits 0.
func TestLoadRunsSluiceLoad(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\necho \"sluice-load $*\"\nexit 3\n"
	if err := os.WriteFile(filepath.Join(dir, "sluice-load"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		if k == "PATH" {
			return dir
		}
		return ""
	}
	var out, errOut bytes.Buffer
	code := run([]string{"load", "--target", "envoy", "--no-such-flag"}, &out, &errOut, env)
	if code != 3 || out.String() != "sluice-load --target envoy --no-such-flag\n" {
		t.Errorf("sluice load: exit %d, %q (stderr %q); want 3 and the arguments passed through", code, out.String(), errOut.String())
	}

	empty := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want int
	}{{[]string{"load", "--help"}, 0}, {[]string{"load"}, 0}, {[]string{"load", "--duration", "1s"}, 2}} {
		out.Reset()
		errOut.Reset()
		if code := run(tc.args, &out, &errOut, empty); code != tc.want || !strings.Contains(errOut.String(), "make build") {
			t.Errorf("sluice %s without sluice-load: exit %d, %q; want %d and how to build it", strings.Join(tc.args, " "), code, errOut.String(), tc.want)
		}
	}
}
