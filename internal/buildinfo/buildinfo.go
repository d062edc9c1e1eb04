// Package buildinfo says which build of Sluice is running: its version,
// the commit it was built from, when, and with which Go.
//
// Release builds set the version, commit and date with the linker:
//
//	go build -ldflags "-X github.com/sluicehq/sluice/internal/buildinfo.version=v1.2.3 \
//	  -X github.com/sluicehq/sluice/internal/buildinfo.commit=$(git rev-parse HEAD) \
//	  -X github.com/sluicehq/sluice/internal/buildinfo.date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" ./cmd/sluice
//
// Without them, Read takes what the Go toolchain recorded in the binary:
// the module's version (a tag, or "(devel)" for a build from a checkout)
// and the version control revision and time of the checkout.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags "-X ..."; see the package documentation.
var version, commit, date string

// Info describes a build. Fields that are not known are "unknown".
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Date      string `json:"date"`
	GoVersion string `json:"go_version"`
}

// Read returns the running binary's Info: the values set with -ldflags
// first, then those the Go toolchain recorded.
func Read() Info {
	i := Info{Version: version, Commit: commit, Date: date, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" {
			i.Version = bi.Main.Version
		}
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if i.Commit == "" {
					i.Commit = s.Value
				}
			case "vcs.time":
				if i.Date == "" {
					i.Date = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && commit == "" && i.Commit != "" {
			i.Commit += "-dirty"
		}
	}
	for _, f := range []*string{&i.Version, &i.Commit, &i.Date} {
		if *f == "" {
			*f = "unknown"
		}
	}
	return i
}

// String returns the Info as one line, as `sluice version` prints it.
func (i Info) String() string {
	return fmt.Sprintf("sluice %s (commit %s, built %s, %s)", i.Version, i.Commit, i.Date, i.GoVersion)
}
