package adminapi

import "testing"

// newPlane returns a real control plane on a file store in t.TempDir().
// The control plane's constructor lands with its file store; until then
// the tests that need it skip.
func newPlane(t *testing.T) Plane {
	t.Helper()
	t.Skip("control.Plane on its file store is not merged into this branch yet")
	return nil
}
