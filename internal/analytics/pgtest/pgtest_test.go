package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestStartStopRestart(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Port == 5432 {
		t.Fatal("started on the standard port")
	}
	url := s.NewDatabase(t)
	ctx := context.Background()
	query := func() error {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		var n int
		return c.QueryRow(ctx, "SELECT 1").Scan(&n)
	}
	if err := query(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if err := query(); err == nil {
		t.Fatal("query succeeded with the server killed")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := query(); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}
