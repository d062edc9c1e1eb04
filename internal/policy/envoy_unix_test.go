//go:build unix

package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReadOpensOnlyRegularFiles(t *testing.T) {
	dir := t.TempDir()
	zero := filepath.Join(dir, "zero.yaml")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{zero, fifo} {
		start := time.Now()
		_, err := Load(path)
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Load(%s): got %v, want not a regular file", path, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("Load(%s) took %s", path, took)
		}
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxConfigBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("Load of %d bytes: got %v, want an error saying it is too large", MaxConfigBytes+1, err)
	}
}
