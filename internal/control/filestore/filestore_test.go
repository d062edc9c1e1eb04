package filestore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/control/backendtest"
	"github.com/sluicehq/sluice/internal/control/filestore"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) control.Backend {
		s, err := filestore.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestDurable(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s, err := filestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.Txn(ctx, []control.Op{{Key: "k", Value: []byte("v"), IfVersion: control.MustNotExist}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(ctx, "inst", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, _, err := s.Get(ctx, ""); !errors.Is(err, control.ErrUnavailable) {
		t.Errorf("Get after Close: %v, want ErrUnavailable", err)
	}
	s, err = filestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kvs, got, err := s.Get(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if got < rev || len(kvs) != 1 || string(kvs[0].Value) != "v" || kvs[0].Version != 1 {
		t.Errorf("reopened: rev %d %+v, want rev >= %d and only k=v v1", got, kvs, rev)
	}
	// A watch from before the reopening is told to read everything.
	r := <-s.Watch(ctx, "", 1)
	if !r.Compacted {
		t.Errorf("watch from revision 1 after reopening: %+v, want Compacted", r)
	}
}
