package filestore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/internal/control/filestore"
)

// FuzzOpen: whatever the store's file holds, Open returns an error or a
// store that answers Get, never a panic.
func FuzzOpen(f *testing.F) {
	f.Add([]byte(`{"revision":3,"keys":[{"key":"rules/a","value":"e30=","version":2,"mod_revision":3}]}`))
	f.Add([]byte(`{"revision":-1,"keys":[{"key":"","value":null}]}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "control.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := filestore.Open(dir)
		if err != nil {
			return
		}
		defer s.Close()
		if _, _, err := s.Get(context.Background(), ""); err != nil {
			t.Fatal(err)
		}
	})
}
