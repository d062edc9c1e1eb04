package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestReadFillsEveryField(t *testing.T) {
	i := Read()
	if i.Version == "" || i.Commit == "" || i.Date == "" {
		t.Errorf("Read() = %+v, want every field set (unknown at worst)", i)
	}
	if i.GoVersion != runtime.Version() {
		t.Errorf("GoVersion = %q, want %q", i.GoVersion, runtime.Version())
	}
}

func TestLinkerValuesWin(t *testing.T) {
	defer func(v, c, d string) { version, commit, date = v, c, d }(version, commit, date)
	version, commit, date = "v1.2.3", "abc123", "2026-01-02T03:04:05Z"
	i := Read()
	if i.Version != "v1.2.3" || i.Commit != "abc123" || i.Date != "2026-01-02T03:04:05Z" {
		t.Errorf("Read() = %+v, want the linker's values", i)
	}
	if s := i.String(); !strings.Contains(s, "v1.2.3") || !strings.Contains(s, "abc123") {
		t.Errorf("String() = %q", s)
	}
}
