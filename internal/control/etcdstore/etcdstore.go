// Package etcdstore is the control plane's distributed store: its keys in
// etcd, under a prefix, so that every Sluice instance watching them applies
// a change within milliseconds of its write.
//
// A transaction is one etcd Txn whose comparisons are the ops'
// preconditions on each key's version; a watch resumes from the revision
// after the last one it delivered, so a broken watch misses and repeats
// nothing. Instances register under a lease that etcd drops when they stop
// renewing it.
package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/control"
)

// Defaults of Config.
const (
	DefaultPrefix         = "/sluice/"
	DefaultDialTimeout    = 2 * time.Second
	DefaultRequestTimeout = 2 * time.Second
)

// Config configures a Store.
type Config struct {
	// Endpoints are etcd's client URLs, such as http://10.0.0.1:2379.
	// Required.
	Endpoints []string
	// Prefix is put before every key; empty means DefaultPrefix. Several
	// Sluice deployments may share one etcd under different prefixes.
	Prefix string
	// Username and Password authenticate to etcd when Username is set.
	Username, Password string
	// TLS, when set, is used to reach etcd.
	TLS *tls.Config
	// DialTimeout bounds connecting; zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// RequestTimeout bounds each read and write when the caller's context
	// has no earlier deadline; zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
}

// ParseURL returns the Config of a --config-store URL:
// etcd://host:2379,host2:2379[/prefix] (etcds:// for TLS, whose tls.Config
// the caller fills), with user:password@ optional.
func ParseURL(raw string) (Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Config{}, fmt.Errorf("etcdstore: %w", err)
	}
	scheme := "http"
	switch u.Scheme {
	case "etcd":
	case "etcds":
		scheme = "https"
	default:
		return Config{}, fmt.Errorf("etcdstore: %q: want etcd://host:port[,host:port...][/prefix] or etcds://", raw)
	}
	var c Config
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return Config{}, fmt.Errorf("etcdstore: %q: an empty host", raw)
		}
		c.Endpoints = append(c.Endpoints, scheme+"://"+h)
	}
	if len(c.Endpoints) == 0 {
		return Config{}, fmt.Errorf("etcdstore: %q: no host", raw)
	}
	if u.User != nil {
		c.Username = u.User.Username()
		c.Password, _ = u.User.Password()
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		c.Prefix = "/" + p + "/"
	}
	return c, nil
}

// Store is a control.Backend in etcd. It is safe for concurrent use.
type Store struct {
	cli     *clientv3.Client
	prefix  string
	timeout time.Duration

	// mu guards leases.
	mu     sync.Mutex
	leases map[string]clientv3.LeaseID // registered key -> its lease
}

var _ control.Backend = (*Store)(nil)

// Open returns a Store on the etcd cluster c names. It does not wait for
// etcd: a store that cannot be reached makes each call fail with
// control.ErrUnavailable until it can.
func Open(c Config) (*Store, error) {
	if len(c.Endpoints) == 0 {
		return nil, errors.New("etcdstore: no endpoints")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            c.Endpoints,
		DialTimeout:          orDefault(c.DialTimeout, DefaultDialTimeout),
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Username:             c.Username,
		Password:             c.Password,
		TLS:                  c.TLS,
		// The client's own log would repeat every failed attempt while
		// etcd is down; the control plane reports the store's state.
		Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: %w", err)
	}
	prefix := c.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Store{cli: cli, prefix: prefix, timeout: orDefault(c.RequestTimeout, DefaultRequestTimeout), leases: map[string]clientv3.LeaseID{}}, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// bounded returns ctx bounded by the request timeout.
func (s *Store) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(clientv3.WithRequireLeader(ctx), s.timeout)
}

// unavailable wraps an etcd error as control.ErrUnavailable, keeping ctx's
// own cancellation as it is.
func unavailable(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	return fmt.Errorf("etcd: %w: %w", control.ErrUnavailable, err)
}

// Get implements control.Backend.
func (s *Store) Get(ctx context.Context, prefix string) ([]control.KV, int64, error) {
	rctx, cancel := s.bounded(ctx)
	defer cancel()
	resp, err := s.cli.Get(rctx, s.prefix+prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, unavailable(ctx, err)
	}
	out := make([]control.KV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, s.kv(kv))
	}
	return out, resp.Header.Revision, nil
}

func (s *Store) kv(kv *mvccpb.KeyValue) control.KV {
	return control.KV{
		Key:         strings.TrimPrefix(string(kv.Key), s.prefix),
		Value:       kv.Value,
		Version:     kv.Version,
		ModRevision: kv.ModRevision,
	}
}

// Txn implements control.Backend.
func (s *Store) Txn(ctx context.Context, ops []control.Op) (int64, error) {
	var cmps []clientv3.Cmp
	var then []clientv3.Op
	var checked []string
	for _, op := range ops {
		key := s.prefix + op.Key
		if op.IfVersion != control.AnyVersion {
			cmps = append(cmps, clientv3.Compare(clientv3.Version(key), "=", op.IfVersion))
			checked = append(checked, key)
		}
		if op.Delete {
			then = append(then, clientv3.OpDelete(key))
		} else {
			then = append(then, clientv3.OpPut(key, string(op.Value)))
		}
	}
	// On failure, read the checked keys in the same transaction to say
	// which precondition failed.
	var otherwise []clientv3.Op
	for _, k := range checked {
		otherwise = append(otherwise, clientv3.OpGet(k))
	}
	rctx, cancel := s.bounded(ctx)
	defer cancel()
	resp, err := s.cli.Txn(rctx).If(cmps...).Then(then...).Else(otherwise...).Commit()
	if err != nil {
		return 0, unavailable(ctx, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	for i, r := range resp.Responses {
		var cur int64
		if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
			cur = kvs[0].Version
		}
		want := int64(0)
		for _, op := range ops {
			if s.prefix+op.Key == checked[i] {
				want = op.IfVersion
				break
			}
		}
		if cur != want {
			return 0, &control.VersionError{Key: strings.TrimPrefix(checked[i], s.prefix), Current: cur}
		}
	}
	// A key changed between the comparison and the read: report the first.
	return 0, &control.VersionError{Key: strings.TrimPrefix(checked[0], s.prefix)}
}

// Watch implements control.Backend.
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) <-chan control.WatchResponse {
	out := make(chan control.WatchResponse, 16)
	go func() {
		defer close(out)
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		defer cancel()
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithPrevKV()}
		if fromRev > 0 {
			opts = append(opts, clientv3.WithRev(fromRev))
		}
		send := func(r control.WatchResponse) bool {
			select {
			case out <- r:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for resp := range s.cli.Watch(wctx, s.prefix+prefix, opts...) {
			if resp.CompactRevision != 0 {
				send(control.WatchResponse{Revision: resp.CompactRevision, Compacted: true})
				return
			}
			if err := resp.Err(); err != nil {
				send(control.WatchResponse{Err: unavailable(ctx, err)})
				return
			}
			if resp.IsProgressNotify() {
				continue
			}
			r := control.WatchResponse{Revision: resp.Header.Revision}
			for _, ev := range resp.Events {
				e := control.Event{KV: s.kv(ev.Kv)}
				if ev.Type == clientv3.EventTypeDelete {
					e.Delete = true
				}
				r.Events = append(r.Events, e)
			}
			if len(r.Events) > 0 {
				r.Revision = r.Events[len(r.Events)-1].KV.ModRevision
			}
			if !send(r) {
				return
			}
		}
		if ctx.Err() == nil {
			send(control.WatchResponse{Err: fmt.Errorf("etcd: %w: the watch ended", control.ErrUnavailable)})
		}
	}()
	return out
}

// Register implements control.Backend: key is put under a lease of ttl that
// is kept alive until ctx ends or the store closes.
func (s *Store) Register(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	s.mu.Lock()
	id, ok := s.leases[key]
	s.mu.Unlock()
	if !ok {
		secs := int64(max(ttl.Round(time.Second)/time.Second, 1))
		rctx, cancel := s.bounded(ctx)
		lease, err := s.cli.Grant(rctx, secs)
		cancel()
		if err != nil {
			return unavailable(ctx, err)
		}
		id = lease.ID
		ka, err := s.cli.KeepAlive(ctx, id)
		if err != nil {
			return unavailable(ctx, err)
		}
		go func() {
			for range ka { // drained until ctx ends or the lease is lost
			}
			s.mu.Lock()
			if s.leases[key] == id {
				delete(s.leases, key)
			}
			s.mu.Unlock()
		}()
		s.mu.Lock()
		s.leases[key] = id
		s.mu.Unlock()
	}
	rctx, cancel := s.bounded(ctx)
	defer cancel()
	_, err := s.cli.Put(rctx, s.prefix+key, string(value), clientv3.WithLease(id))
	if isLeaseGone(err) {
		s.mu.Lock()
		delete(s.leases, key)
		s.mu.Unlock()
	}
	return unavailable(ctx, err)
}

func isLeaseGone(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return true
	}
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.NotFound
}

// Close implements control.Backend.
func (s *Store) Close() error { return s.cli.Close() }
