// Package atomicfile writes files so that a crash leaves the old contents
// or the new, never a part.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with b atomically: a temporary file beside it,
// synced, renamed over it, and the directory synced. A reader sees the old
// contents or the new, never a part.
func Write(path string, b []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
