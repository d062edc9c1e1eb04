package etcdstore_test

import (
	"fmt"
	"os"
	"testing"

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
	closeVariants()
	os.Exit(code)
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) control.Backend {
		s, err := etcdstore.Open(etcdstore.Options{Endpoints: []string{server.Endpoint()}, Prefix: server.Prefix()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url, prefix, user string
		eps               int
		tls, bad          bool
	}{
		{url: "etcd://a:2379,b:2379", eps: 2},
		{url: "etcds://u:p@a:2379/x/y", eps: 1, prefix: "/x/y/", user: "u", tls: true},
		{url: "redis://a:1", bad: true},
		{url: "etcd://", bad: true},
	} {
		o, err := etcdstore.ParseURL(tc.url)
		if tc.bad {
			if err == nil {
				t.Errorf("%s: no error", tc.url)
			}
			continue
		}
		if err != nil || len(o.Endpoints) != tc.eps || o.Prefix != tc.prefix || o.Username != tc.user || (o.TLS != nil) != tc.tls {
			t.Errorf("%s: %+v %v", tc.url, o, err)
		}
	}
}
