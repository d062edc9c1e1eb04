package adminapi

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/control/filestore"
)

// newPlane returns a real control plane on a file store in t.TempDir(),
// its clock now, closed when the test ends.
func newPlane(t *testing.T, now func() time.Time) *control.Plane {
	t.Helper()
	// Not t.TempDir: the file store may still be finishing a write when
	// the Plane is closed, and TempDir fails the test on a non-empty
	// directory.
	dir, err := os.MkdirTemp("", "adminapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s, err := filestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := control.Open(context.Background(), control.Options{Backend: s, Instance: "test", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
