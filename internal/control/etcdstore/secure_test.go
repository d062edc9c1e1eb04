package etcdstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/control/backendtest"
	"github.com/sluicehq/sluice/internal/control/etcdstore"
	"github.com/sluicehq/sluice/internal/control/etcdtest"
)

// The servers over TLS and with authentication, each started by the first
// test that needs it and stopped by TestMain.
var variants = struct {
	sync.Mutex
	servers map[string]*etcdtest.Server
	errs    map[string]error
}{servers: map[string]*etcdtest.Server{}, errs: map[string]error{}}

const rootPassword = "s3cret pass"

var variantConfigs = map[string]etcdtest.Config{
	"tls":  {TLS: true},
	"mtls": {TLS: true, ClientCerts: true},
	"auth": {RootPassword: rootPassword},
}

func variant(t *testing.T, name string) *etcdtest.Server {
	t.Helper()
	variants.Lock()
	defer variants.Unlock()
	s, err := variants.servers[name], variants.errs[name]
	if s == nil && err == nil {
		s, err = etcdtest.StartConfig(variantConfigs[name])
		variants.servers[name], variants.errs[name] = s, err
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func closeVariants() {
	variants.Lock()
	defer variants.Unlock()
	for _, s := range variants.servers {
		if s != nil {
			s.Close()
		}
	}
}

// roundTrip writes a key and reads it back through a Store of o.
func roundTrip(o etcdstore.Options) error {
	s, err := etcdstore.Open(o)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Txn(ctx, []control.Op{{Key: "k", Value: []byte("v"), IfVersion: control.AnyVersion}}); err != nil {
		return err
	}
	kvs, _, err := s.Get(ctx, "k")
	if err != nil {
		return err
	}
	if len(kvs) != 1 || string(kvs[0].Value) != "v" {
		return errors.New("read back " + string(kvs[0].Value))
	}
	return nil
}

// options parses url (of server s) and shortens the timeouts, so that the
// connections meant to fail fail fast.
func options(t *testing.T, url string) etcdstore.Options {
	t.Helper()
	o, err := etcdstore.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	o.DialTimeout, o.RequestTimeout = 2*time.Second, 2*time.Second
	return o
}

func TestTLS(t *testing.T) {
	srv := variant(t, "tls")
	url := "etcds://" + srv.Endpoint() + srv.Prefix()
	for _, tc := range []struct {
		name   string
		ca     string
		scheme string
		want   string // in the error; empty: works
	}{
		{name: "with the CA", ca: srv.CAFile()},
		{name: "system roots", want: "certificate signed by unknown authority"},
		{name: "CA without etcds", ca: srv.CAFile(), scheme: "etcd://", want: "use an etcds:// URL"},
		{name: "CA file missing", ca: srv.CAFile() + ".missing", want: "CA file"},
		{name: "not a CA file", ca: srv.ClientKeyFile(), want: "no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := url
			if tc.scheme != "" {
				u = tc.scheme + strings.TrimPrefix(u, "etcds://")
			}
			o := options(t, u)
			o.CAFile = tc.ca
			check(t, roundTrip(o), tc.want)
		})
	}
}

func TestClientCertificate(t *testing.T) {
	srv := variant(t, "mtls")
	url := "etcds://" + srv.Endpoint() + srv.Prefix()
	for _, tc := range []struct {
		name      string
		cert, key string
		want      string
	}{
		{name: "with a certificate", cert: srv.ClientCertFile(), key: srv.ClientKeyFile()},
		{name: "without", want: "certificate required"},
		{name: "certificate without key", cert: srv.ClientCertFile(), want: "both its certificate file and its key file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := options(t, url)
			o.CAFile, o.CertFile, o.KeyFile = srv.CAFile(), tc.cert, tc.key
			check(t, roundTrip(o), tc.want)
		})
	}
}

func TestAuth(t *testing.T) {
	srv := variant(t, "auth")
	for _, tc := range []struct {
		name     string
		userinfo string
		want     string
	}{
		{name: "root", userinfo: "root:s3cret%20pass@"},
		{name: "wrong password", userinfo: "root:wrong@", want: "authentication failed"},
		{name: "no user", want: "user name is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, roundTrip(options(t, "etcd://"+tc.userinfo+srv.Endpoint()+srv.Prefix())), tc.want)
		})
	}
}

// check reports err unless it is nil when want is empty, or says want.
func check(t *testing.T, err error, want string) {
	t.Helper()
	if err != nil {
		t.Logf("error: %v", err)
	}
	switch {
	case want == "" && err != nil:
		t.Errorf("error %v, want none", err)
	case want != "" && err == nil:
		t.Errorf("no error, want one saying %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Errorf("error %q does not say %q", err, want)
	}
}

// An authenticating store opened while etcd is down is opened all the
// same (an instance then serves its data directory's copy), fails its
// calls as unavailable, and works once etcd is back.
func TestAuthEtcdDownAtOpen(t *testing.T) {
	srv := variant(t, "auth")
	srv.Stop()
	stopped := true
	t.Cleanup(func() {
		if stopped {
			srv.Start()
		}
	})
	o := options(t, "etcd://root:s3cret%20pass@"+srv.Endpoint()+srv.Prefix())
	o.DialTimeout = 500 * time.Millisecond
	s, err := etcdstore.Open(o)
	if err != nil {
		t.Fatalf("Open with etcd down: %v, want a store", err)
	}
	defer s.Close()
	if _, _, err := s.Get(context.Background(), "k"); !errors.Is(err, control.ErrUnavailable) {
		t.Fatalf("Get with etcd down: %v, want ErrUnavailable", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	stopped = false
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, err := s.Get(context.Background(), "k")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Get 10s after etcd's return: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAuthPrefixUser runs the conformance suite as a user whose role may
// read and write the store's prefix and nothing else, as docs/operations.md
// advises: Sluice needs no more.
func TestAuthPrefixUser(t *testing.T) {
	srv := variant(t, "auth")
	root, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Username: "root", Password: rootPassword,
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	ctx := context.Background()
	backendtest.Run(t, func(t *testing.T) control.Backend {
		prefix := srv.Prefix()
		name := strings.Trim(prefix, "/")
		for _, err := range []error{
			second(root.RoleAdd(ctx, name)),
			second(root.RoleGrantPermission(ctx, name, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))),
			second(root.UserAdd(ctx, name, "pw-"+name)),
			second(root.UserGrantRole(ctx, name, name)),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		o := options(t, "etcd://"+name+":pw-"+name+"@"+srv.Endpoint()+prefix)
		s, err := etcdstore.Open(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func second[T any](_ T, err error) error { return err }
