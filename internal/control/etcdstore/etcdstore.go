// Package etcdstore is the control plane's store in etcd, shared by every
// instance of Sluice: transactions compare keys' versions, watches resume
// from the last revision seen, and instances register under leases.
package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/sluicehq/sluice/internal/control"
)

// DefaultPrefix is the prefix of Sluice's keys when the URL names none.
const DefaultPrefix = "/sluice/"

// Options configure a Store.
type Options struct {
	// Endpoints are etcd's client addresses, host:port or URLs.
	Endpoints []string
	// Prefix is put before every key; the default is DefaultPrefix.
	Prefix string
	// DialTimeout bounds connecting; the default is 5s.
	DialTimeout time.Duration
	// RequestTimeout bounds each Get, Txn and registration; the default
	// is 5s.
	RequestTimeout time.Duration
	// TLS, when set, secures the connections.
	TLS *tls.Config
	// CAFile is a PEM file of the CAs that sign etcd's certificates,
	// trusted instead of the system's roots. CertFile and KeyFile are the
	// PEM files of a client certificate and its key, for an etcd that
	// requires one (--client-cert-auth). They need TLS.
	CAFile, CertFile, KeyFile string
	// Username and Password authenticate, when Username is set.
	Username, Password string
}

// ParseURL reads the store's URL: etcd://host:2379,host2:2379/prefix/
// (etcds:// for TLS, with the system's roots unless Options.CAFile names
// others; user:password@ to authenticate). The prefix defaults to DefaultPrefix.
func ParseURL(s string) (Options, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Options{}, fmt.Errorf("etcdstore: %w", err)
	}
	var o Options
	switch u.Scheme {
	case "etcd":
	case "etcds":
		o.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	default:
		return Options{}, fmt.Errorf("etcdstore: %q: scheme must be etcd or etcds", s)
	}
	if u.Host == "" {
		return Options{}, fmt.Errorf("etcdstore: %q: no endpoint", s)
	}
	for h := range strings.SplitSeq(u.Host, ",") {
		if h == "" {
			return Options{}, fmt.Errorf("etcdstore: %q: empty endpoint", s)
		}
		o.Endpoints = append(o.Endpoints, h)
	}
	if u.User != nil {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	if u.Path != "" && u.Path != "/" {
		o.Prefix = strings.TrimSuffix(u.Path, "/") + "/"
	}
	return o, nil
}

// Store is a control.Backend in etcd. It is safe for concurrent use.
type Store struct {
	config    clientv3.Config
	cli       atomic.Pointer[clientv3.Client] // nil until connected
	closed    atomic.Bool
	prefix    string
	timeout   time.Duration
	endpoints []string    // host:port
	tls       *tls.Config // nil: plain connections

	mu       sync.Mutex
	leases   map[string]clientv3.LeaseID // registered keys
	failedAt time.Time                   // of the last failed connection, with
	failErr  error                       // its error
}

// Open connects to etcd; it does not wait for etcd to answer. With a
// Username, etcd's client authenticates as it connects: Open tries once,
// for at most DialTimeout, and fails on a wrong password; when etcd does
// not answer, each call tries again, so that an instance started while
// etcd is down serves what it has (the data directory's copy) until etcd
// returns.
func Open(o Options) (*Store, error) {
	if len(o.Endpoints) == 0 {
		return nil, errors.New("etcdstore: no endpoints")
	}
	tc, err := tlsConfig(o)
	if err != nil {
		return nil, err
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 5 * time.Second
	}
	eps := make([]string, len(o.Endpoints))
	for i, e := range o.Endpoints {
		eps[i] = strings.TrimPrefix(strings.TrimPrefix(e, "http://"), "https://")
	}
	s := &Store{prefix: o.Prefix, timeout: o.RequestTimeout, endpoints: eps, tls: tc, leases: map[string]clientv3.LeaseID{}}
	s.config = clientv3.Config{
		Endpoints: eps, DialTimeout: o.DialTimeout, TLS: tc,
		Username: o.Username, Password: o.Password,
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		Logger: zap.NewNop(),
		// Reconnect within a second or two of etcd's return, not gRPC's
		// default of up to two minutes.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: o.DialTimeout,
		})},
	}
	if _, err := s.client(); err != nil && (o.Username == "" || !errors.Is(err, control.ErrUnavailable)) {
		return nil, err
	}
	return s, nil
}

// redialAfter is how long after a failed connection the calls fail with
// its error rather than try again: each try can take DialTimeout.
const redialAfter = time.Second

// client returns the etcd client, connecting first if no attempt has
// succeeded yet (only with a Username can one fail for want of etcd).
// Concurrent first calls may both connect; one client is kept.
func (s *Store) client() (*clientv3.Client, error) {
	if c := s.cli.Load(); c != nil {
		return c, nil
	}
	if s.closed.Load() {
		return nil, errClosed
	}
	s.mu.Lock()
	failed, ferr := s.failedAt, s.failErr
	s.mu.Unlock()
	if ferr != nil && time.Since(failed) < redialAfter {
		return nil, ferr
	}
	c, err := clientv3.New(s.config)
	if err != nil {
		if errors.Is(err, rpctypes.ErrAuthFailed) {
			err = fmt.Errorf("etcdstore: user %q: %w", s.config.Username, err)
		} else {
			err = s.unavailable(err)
		}
		s.mu.Lock()
		s.failedAt, s.failErr = time.Now(), err
		s.mu.Unlock()
		return nil, err
	}
	if !s.cli.CompareAndSwap(nil, c) {
		c.Close()
		return s.cli.Load(), nil
	}
	if s.closed.Load() { // Close ran while this connected
		c.Close()
		return nil, errClosed
	}
	return c, nil
}

var errClosed = errors.New("etcdstore: closed")

// unavailable wraps the error of a call etcd did not answer, with the
// reason a TLS connection fails when that is why.
func (s *Store) unavailable(err error) error {
	if herr := s.diagnoseTLS(err); herr != nil {
		return fmt.Errorf("etcdstore: %w: %w (%w)", control.ErrUnavailable, err, herr)
	}
	return fmt.Errorf("etcdstore: %w: %w", control.ErrUnavailable, err)
}

// Get implements control.Backend.
func (s *Store) Get(ctx context.Context, prefix string) ([]control.KV, int64, error) {
	cli, err := s.client()
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), s.timeout)
	defer cancel()
	resp, err := cli.Get(ctx, s.prefix+prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, s.unavailable(err)
	}
	out := make([]control.KV, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		out[i] = control.KV{Key: string(kv.Key[len(s.prefix):]), Value: kv.Value, Version: kv.Version, ModRevision: kv.ModRevision}
	}
	return out, resp.Header.Revision, nil
}

// Txn implements control.Backend with one etcd transaction comparing the
// versions of the keys its ops name.
func (s *Store) Txn(ctx context.Context, ops []control.Op) (int64, error) {
	cli, err := s.client()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), s.timeout)
	defer cancel()
	var cmps []clientv3.Cmp
	var writes, reads []clientv3.Op
	for _, op := range ops {
		k := s.prefix + op.Key
		if op.IfVersion != control.AnyVersion {
			cmps = append(cmps, clientv3.Compare(clientv3.Version(k), "=", op.IfVersion))
			reads = append(reads, clientv3.OpGet(k))
		}
		if op.Delete {
			writes = append(writes, clientv3.OpDelete(k))
		} else {
			writes = append(writes, clientv3.OpPut(k, string(op.Value)))
		}
	}
	resp, err := cli.Txn(ctx).If(cmps...).Then(writes...).Else(reads...).Commit()
	if err != nil {
		return 0, s.unavailable(err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	// Find the key whose version was not the one required.
	i := 0
	for _, op := range ops {
		if op.IfVersion == control.AnyVersion {
			continue
		}
		var cur int64
		if r := resp.Responses[i].GetResponseRange(); r != nil && len(r.Kvs) > 0 {
			cur = r.Kvs[0].Version
		}
		i++
		if cur != op.IfVersion {
			return 0, &control.VersionError{Key: op.Key, Current: cur}
		}
	}
	return 0, &control.VersionError{Key: ops[0].Key} // changed and changed back: report the first
}

// Watch implements control.Backend. Watches require a leader: a member cut
// off from the cluster ends them with an error rather than staying silent.
func (s *Store) Watch(ctx context.Context, prefix string, fromRev int64) <-chan control.WatchResponse {
	ch := make(chan control.WatchResponse, 1)
	go func() {
		defer close(ch)
		cli, err := s.client()
		if err != nil {
			select {
			case ch <- control.WatchResponse{Err: err}:
			case <-ctx.Done():
			}
			return
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		defer cancel()
		for resp := range cli.Watch(wctx, s.prefix+prefix, clientv3.WithPrefix(), clientv3.WithRev(fromRev)) {
			var r control.WatchResponse
			switch {
			case resp.CompactRevision != 0:
				r = control.WatchResponse{Revision: resp.CompactRevision, Compacted: true}
			case resp.Err() != nil:
				r = control.WatchResponse{Err: s.unavailable(resp.Err())}
			case len(resp.Events) == 0:
				continue // progress notices
			default:
				r.Revision = resp.Header.Revision
				for _, ev := range resp.Events {
					kv := control.KV{Key: string(ev.Kv.Key[len(s.prefix):]), Value: ev.Kv.Value, Version: ev.Kv.Version, ModRevision: ev.Kv.ModRevision}
					r.Events = append(r.Events, control.Event{Delete: ev.Type == clientv3.EventTypeDelete, KV: kv})
				}
			}
			select {
			case ch <- r:
			case <-ctx.Done():
				return
			}
			if r.Compacted || r.Err != nil {
				return
			}
		}
	}()
	return ch
}

// Register implements control.Backend with a lease of ttl (at least 2s)
// kept alive until ctx ends, then revoked. When the lease is lost (etcd
// unreachable for longer than ttl), the next Register takes a new one.
func (s *Store) Register(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	cli, err := s.client()
	if err != nil {
		return err
	}
	k := s.prefix + key
	s.mu.Lock()
	id, ok := s.leases[k]
	s.mu.Unlock()
	rctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), s.timeout)
	defer cancel()
	if !ok {
		secs := max(int64(ttl/time.Second), 2)
		g, err := cli.Grant(rctx, secs)
		if err != nil {
			return s.unavailable(err)
		}
		id = g.ID
		alive, err := cli.KeepAlive(ctx, id)
		if err != nil {
			return s.unavailable(err)
		}
		s.mu.Lock()
		s.leases[k] = id
		s.mu.Unlock()
		go s.keep(ctx, cli, k, id, alive)
	}
	if _, err := cli.Put(rctx, k, string(value), clientv3.WithLease(id)); err != nil {
		return s.unavailable(err)
	}
	return nil
}

// keep drains the keep-alive answers of lease id; when they end it forgets
// the lease and, if ctx ended, revokes it.
func (s *Store) keep(ctx context.Context, cli *clientv3.Client, k string, id clientv3.LeaseID, alive <-chan *clientv3.LeaseKeepAliveResponse) {
	for range alive {
	}
	s.mu.Lock()
	if s.leases[k] == id {
		delete(s.leases, k)
	}
	s.mu.Unlock()
	if ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		_, _ = cli.Revoke(rctx, id)
	}
}

// Close implements control.Backend.
func (s *Store) Close() error {
	s.closed.Store(true)
	if c := s.cli.Load(); c != nil {
		return c.Close()
	}
	return nil
}
