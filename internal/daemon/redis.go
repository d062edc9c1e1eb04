package daemon

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/store/redis"
)

// The Redis store is a store of the engine's (and, by its Info, keeps
// idempotency records for every instance sharing it).
var _ engine.Store = (*redis.Store)(nil)

// RedisOptions are the connection settings of a Redis store (see
// redis.Config for each); zero fields take the store's defaults.
type RedisOptions struct {
	// DialTimeout bounds the opening of a connection.
	DialTimeout time.Duration
	// WriteTimeout is how long a connection may leave a ping unanswered
	// before it is closed and its calls fail.
	WriteTimeout time.Duration
	// KeepAlive is the period of TCP keep-alive probes, and how long a
	// connection may answer nothing before it is pinged; negative turns
	// both off.
	KeepAlive time.Duration
	// ConnsPerNode is the number of connections to each node, over which
	// concurrent calls are pipelined.
	ConnsPerNode int

	// The TLS options apply to rediss:// and rediss-cluster:// stores
	// only: given with another store, they make Start fail. The files are
	// read once, by Start; a configuration reload does not read them
	// again.

	// TLSCAFile is a PEM file of the certificates of the authorities the
	// server's certificate must chain to, in place of the system's; empty
	// means the system's.
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are the PEM files of the client
	// certificate (followed by its intermediates, if any) and of its
	// private key, presented to a server that asks for one (mutual TLS).
	// Both or neither.
	TLSCertFile, TLSKeyFile string
	// TLSServerName is the name the certificate of every server must
	// hold; empty means the host of each address dialed.
	TLSServerName string
}

// RedisTLSError reports a TLS option of RedisOptions that cannot be used:
// given for a store that does not use TLS, missing its pair, or naming a
// file that cannot be read or parsed. Its message never holds key
// material.
type RedisTLSError struct {
	// Option is the name of the RedisOptions field: TLSCAFile,
	// TLSCertFile, TLSKeyFile or TLSServerName.
	Option string
	// File is the file the option names, when the error is about the
	// file; empty otherwise.
	File string
	// Err says what is wrong.
	Err error
}

// Error names the option, the file and what is wrong.
func (e *RedisTLSError) Error() string {
	if e.File != "" {
		return fmt.Sprintf("daemon: Redis TLS: %s %q: %v", e.Option, e.File, e.Err)
	}
	return fmt.Sprintf("daemon: Redis TLS: %s: %v", e.Option, e.Err)
}

// Unwrap returns Err.
func (e *RedisTLSError) Unwrap() error { return e.Err }

// tlsOption returns the name of the first TLS option set in o, or "" when
// none is.
func (o RedisOptions) tlsOption() string {
	switch {
	case o.TLSCAFile != "":
		return "TLSCAFile"
	case o.TLSCertFile != "":
		return "TLSCertFile"
	case o.TLSKeyFile != "":
		return "TLSKeyFile"
	case o.TLSServerName != "":
		return "TLSServerName"
	}
	return ""
}

// noTLS returns the error of TLS options given for a store of scheme,
// which does not use TLS, or nil when none is given.
func (o RedisOptions) noTLS(scheme string) error {
	if opt := o.tlsOption(); opt != "" {
		return &RedisTLSError{Option: opt, Err: fmt.Errorf("applies only to rediss:// and rediss-cluster:// stores, not %s://", scheme)}
	}
	return nil
}

// applyTLS sets in cfg, a TLS client configuration, the CA, the client
// certificate and the server name of o, reading their files.
func (o RedisOptions) applyTLS(cfg *tls.Config) error {
	if o.TLSCAFile != "" {
		pool, err := loadCAs(o.TLSCAFile)
		if err != nil {
			return &RedisTLSError{Option: "TLSCAFile", File: o.TLSCAFile, Err: err}
		}
		cfg.RootCAs = pool
	}
	switch {
	case o.TLSCertFile != "" && o.TLSKeyFile == "":
		return &RedisTLSError{Option: "TLSKeyFile", Err: fmt.Errorf("missing: the client certificate %q needs its key", o.TLSCertFile)}
	case o.TLSCertFile == "" && o.TLSKeyFile != "":
		return &RedisTLSError{Option: "TLSCertFile", Err: fmt.Errorf("missing: the client key %q needs its certificate", o.TLSKeyFile)}
	case o.TLSCertFile != "":
		cert, err := loadKeyPair(o.TLSCertFile, o.TLSKeyFile)
		if err != nil {
			return err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	cfg.ServerName = o.TLSServerName
	return nil
}

// loadCAs reads a PEM file of CA certificates. Every CERTIFICATE block
// must parse, and there must be at least one; other blocks are skipped.
func loadCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	certs, err := parseCerts(data)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// parseCerts parses the CERTIFICATE blocks of a PEM file, and fails when
// there is none. Its errors quote nothing of the file.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate in the file")
	}
	return certs, nil
}

// loadKeyPair reads a client certificate and its key. An error about the
// key, or about the pair (a key that is not the certificate's), names the
// key file; tls.X509KeyPair's errors show no key material.
func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, &RedisTLSError{Option: "TLSCertFile", File: certFile, Err: err}
	}
	if _, err := parseCerts(certPEM); err != nil {
		return tls.Certificate{}, &RedisTLSError{Option: "TLSCertFile", File: certFile, Err: err}
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, &RedisTLSError{Option: "TLSKeyFile", File: keyFile, Err: err}
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, &RedisTLSError{Option: "TLSKeyFile", File: keyFile,
			Err: fmt.Errorf("not a private key of the certificate %q: %w", certFile, err)}
	}
	return cert, nil
}

// openRedis opens a Redis or Redis Cluster store from its URL
// (redis://host:port[/db], rediss://..., redis-cluster://host:port,...,
// redis-sentinel://host:port,.../master[/db]) and registers its metrics on reg. When no server answers, it returns a
// pendingRedis that connects in the background, unless exitOnUnavailable
// is set or the failure is one that waiting will not mend (see
// definitive): then it fails.
func openRedis(ctx context.Context, rawURL string, opts RedisOptions, exitOnUnavailable bool, log *slog.Logger, reg prometheus.Registerer) (engine.Store, func() error, error) {
	cfg, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: store URL %q: %w", redactURL(rawURL), err)
	}
	if cfg.TLS == nil {
		scheme, _, _ := strings.Cut(rawURL, "://")
		if err := opts.noTLS(scheme); err != nil {
			return nil, nil, err
		}
	} else if err := opts.applyTLS(cfg.TLS); err != nil {
		return nil, nil, err
	}
	cfg.DialTimeout, cfg.WriteTimeout = opts.DialTimeout, opts.WriteTimeout
	cfg.KeepAlive, cfg.ConnsPerNode = opts.KeepAlive, opts.ConnsPerNode
	corrupt := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_redis_corrupt_state_resets_total",
		Help: "Keys whose state the Redis store found corrupt (wrong type, unknown format) and reset.",
	})
	tryAgain := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_redis_tryagain_retries_total",
		Help: "Script calls the Redis store sent again after a Redis Cluster refused them with TRYAGAIN (keys of a slot moving between masters).",
	})
	plain := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_redis_plain_checks_total",
		Help: "Fixed-window checks of cost 1 at Redis' clock, by how the Redis store decided them: by one plain HINCRBY (path=plain) or by a script (path=script: near a window's boundary, no recent reading of Redis' clock, a slot being moved).",
	}, []string{"path"})
	for _, c := range []prometheus.Collector{corrupt, tryAgain, plain} {
		if err := reg.Register(c); err != nil {
			return nil, nil, fmt.Errorf("daemon: metrics: %w", err)
		}
	}
	cfg.Logger = log
	if cfg.MaxFlushDelay == 0 {
		// Gathering the commands of concurrent checks for up to 50 µs per
		// write cost the server 10 to 30% less CPU per check in paired
		// Envoy load runs (docs/PERFORMANCE.md), for at most 50 µs of
		// latency.
		cfg.MaxFlushDelay = 50 * time.Microsecond
	}
	cfg.OnCorrupt = func(n int) { corrupt.Add(float64(n)) }
	cfg.OnTryAgain = func(n int) { tryAgain.Add(float64(n)) }
	plainPlain, plainScript := plain.WithLabelValues("plain"), plain.WithLabelValues("script")
	cfg.OnPlain = func(p, s int) {
		if p > 0 {
			plainPlain.Add(float64(p))
		}
		if s > 0 {
			plainScript.Add(float64(s))
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("daemon: store %q: %w", redactURL(rawURL), err)
	}
	s, err := redis.New(cfg)
	if err != nil {
		missingCert := cfg.TLS != nil && len(cfg.TLS.Certificates) == 0 && closedByPeer(err)
		if missingCert {
			// In TLS 1.3 the server checks the client's certificate
			// after the client has finished its handshake: the client
			// learns of a missing one from its next write or read,
			// which may find the connection reset before the alert
			// that says why.
			err = fmt.Errorf("%w (a server that requires a client certificate closes the connection of a client without one)", err)
		}
		err = fmt.Errorf("daemon: store %q: %w", redactURL(rawURL), err)
		if exitOnUnavailable || missingCert || definitive(err) {
			return nil, nil, err
		}
		// Several addresses are a cluster's seeds, or Sentinels.
		cluster := cfg.MasterSet == "" && (strings.Contains(rawURL, "-cluster://") || len(cfg.Addrs) > 1)
		maxLog := cmp.Or(cfg.MaxLogEntries, redis.DefaultMaxLogEntries)
		p := newPendingRedis(func() (*redis.Store, error) { return redis.New(cfg) }, cluster, maxLog, log, err)
		return p, p.Close, nil
	}
	return s, s.Close, nil
}

// closedByPeer reports whether err is the peer's closing of a connection.
func closedByPeer(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF)
}
