package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/control/backendtest"
	"github.com/sluicehq/sluice/internal/control/etcdstore"
	"github.com/sluicehq/sluice/internal/control/etcdtest"
)

var server *etcdtest.Server

func TestMain(m *testing.M) {
	s, err := etcdtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	server = s
	code := m.Run()
	s.Close()
	os.Exit(code)
}

var prefixes atomic.Int64

// open returns a store on the shared server under a prefix of its own.
func open(t *testing.T) *etcdstore.Store {
	t.Helper()
	c, err := etcdstore.ParseURL(server.URL())
	if err != nil {
		t.Fatal(err)
	}
	c.Prefix = fmt.Sprintf("/test-%d/", prefixes.Add(1))
	c.RequestTimeout = time.Second
	s, err := etcdstore.Open(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) control.Backend { return open(t) })
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		in        string
		endpoints []string
		prefix    string
		user      string
		bad       bool
	}{
		{in: "etcd://a:2379", endpoints: []string{"http://a:2379"}},
		{in: "etcd://a:2379,b:2379/prod", endpoints: []string{"http://a:2379", "http://b:2379"}, prefix: "/prod/"},
		{in: "etcds://u:p@a:2379", endpoints: []string{"https://a:2379"}, user: "u"},
		{in: "http://a:2379", bad: true},
		{in: "etcd://", bad: true},
		{in: "etcd://a:2379,,b:1", bad: true},
	} {
		c, err := etcdstore.ParseURL(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseURL(%q): no error", tc.in)
			}
			continue
		}
		if err != nil || fmt.Sprint(c.Endpoints) != fmt.Sprint(tc.endpoints) || c.Prefix != tc.prefix || c.Username != tc.user {
			t.Errorf("ParseURL(%q) = %+v, %v", tc.in, c, err)
		}
	}
}

// TestOutage: with etcd stopped, reads and writes fail with
// ErrUnavailable and write nothing; once it is back, a watch resumed from
// the last revision seen gets every change made meanwhile, once.
func TestOutage(t *testing.T) {
	s := open(t)
	ctx := context.Background()
	rev, err := s.Txn(ctx, []control.Op{{Key: "a", Value: []byte("1"), IfVersion: control.AnyVersion}})
	if err != nil {
		t.Fatal(err)
	}
	server.Stop()
	restarted := false
	defer func() {
		if !restarted {
			server.Restart()
		}
	}()
	if _, err := s.Txn(ctx, []control.Op{{Key: "b", Value: []byte("2"), IfVersion: control.AnyVersion}}); !errors.Is(err, control.ErrUnavailable) {
		t.Fatalf("Txn with etcd down: %v, want ErrUnavailable", err)
	}
	if _, _, err := s.Get(ctx, ""); !errors.Is(err, control.ErrUnavailable) {
		t.Fatalf("Get with etcd down: %v, want ErrUnavailable", err)
	}
	if err := server.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	// Two changes once it is back; a watch from rev+1 sees both, once.
	deadline := time.Now().Add(10 * time.Second)
	var rev2 int64
	for {
		rev2, err = s.Txn(ctx, []control.Op{{Key: "b", Value: []byte("2"), IfVersion: control.MustNotExist}})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Txn(ctx, []control.Op{{Key: "a", Delete: true, IfVersion: 1}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var got []string
	for r := range s.Watch(wctx, "", rev+1) {
		if r.Err != nil || r.Compacted {
			t.Fatalf("watch: %+v", r)
		}
		for _, e := range r.Events {
			got = append(got, fmt.Sprintf("%s:%v@%d", e.KV.Key, e.Delete, e.KV.ModRevision))
		}
		if len(got) >= 2 {
			break
		}
	}
	want := fmt.Sprintf("[b:false@%d a:true@%d]", rev2, rev2+1)
	if fmt.Sprint(got) != want {
		t.Fatalf("watch after the outage: %v, want %s", got, want)
	}
}
