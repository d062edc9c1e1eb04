// TLS: the configuration from PEM files, and the reason a TLS connection
// fails, which etcd's client does not give (its calls wait for a
// connection until their deadline, and report only the deadline).

package etcdstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// tlsConfig returns o.TLS with the CA and the client certificate of o's
// files.
func tlsConfig(o Options) (*tls.Config, error) {
	if o.CAFile == "" && o.CertFile == "" && o.KeyFile == "" {
		return o.TLS, nil
	}
	if o.TLS == nil {
		return nil, errors.New("etcdstore: a CA or client certificate file is for TLS: use an etcds:// URL")
	}
	tc := o.TLS.Clone()
	if o.CAFile != "" {
		b, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("etcdstore: CA file: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("etcdstore: CA file %s: no PEM certificate", o.CAFile)
		}
		tc.RootCAs = roots
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("etcdstore: a client certificate needs both its certificate file and its key file")
	}
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("etcdstore: client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// probeTimeout bounds the TLS connection of diagnoseTLS, and how long it
// waits for the server to refuse the client's certificate after the
// handshake.
const probeTimeout = time.Second

// diagnoseTLS returns why a TLS connection to etcd fails when err, of a
// call, is the deadline or unavailability that such a failure causes: it
// connects to each endpoint itself, and returns nil when one accepts the
// connection (or without TLS).
func (s *Store) diagnoseTLS(err error) error {
	if s.tls == nil || !(errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.Unavailable) {
		return nil
	}
	var first error
	for _, ep := range s.endpoints {
		perr := probeTLS(ep, s.tls)
		if perr == nil {
			return nil
		}
		if first == nil {
			first = perr
		}
	}
	return first
}

// probeTLS makes a TLS connection to addr with tc, as gRPC would, and
// waits briefly for an alert: with TLS 1.3 a server refuses a client's
// certificate (or its absence) only after the client's side of the
// handshake is done. An error that is not about TLS (nothing listening)
// is not returned.
func probeTLS(addr string, tc *tls.Config) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	cfg := tc.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	cfg.NextProtos = []string{"h2"}
	d := &net.Dialer{Timeout: probeTimeout}
	raw, err := d.Dial("tcp", addr)
	if err != nil {
		return nil
	}
	defer raw.Close()
	c := tls.Client(raw, cfg)
	c.SetDeadline(time.Now().Add(probeTimeout))
	if err := c.Handshake(); err != nil {
		return fmt.Errorf("TLS to %s: %w", addr, err)
	}
	c.SetReadDeadline(time.Now().Add(probeTimeout / 4))
	var b [1]byte
	_, err = c.Read(b[:])
	// The alert a server sends arrives as a "remote error".
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "remote error" {
		return fmt.Errorf("TLS to %s: %w", addr, err)
	}
	return nil
}
