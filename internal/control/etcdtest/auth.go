package etcdtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// enableAuth adds the user root with the configured password and the
// role root, then turns authentication on, as an operator does with
// etcdctl. It is kept in the data directory: a restart keeps it on.
func (s *Server) enableAuth() error {
	tc, err := s.ClientTLS()
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, TLS: tc, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcdtest: connect to enable authentication: %w", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.RoleAdd(ctx, "root"); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("etcdtest: add role root: %w", err)
	}
	if _, err := cli.UserAdd(ctx, "root", s.cfg.RootPassword); err != nil {
		return fmt.Errorf("etcdtest: add user root: %w", err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("etcdtest: grant root to root: %w", err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("etcdtest: enable authentication: %w", err)
	}
	return nil
}

// ClientTLS returns the TLS configuration of a client of a TLS server:
// its CA as the only root, and the client certificate when the server
// requires one. It returns nil without TLS.
func (s *Server) ClientTLS() (*tls.Config, error) {
	if !s.cfg.TLS {
		return nil, nil
	}
	pem, err := os.ReadFile(s.CAFile())
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, errors.New("etcdtest: no certificate in " + caFile)
	}
	tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if s.cfg.ClientCerts {
		cert, err := tls.LoadX509KeyPair(s.ClientCertFile(), s.ClientKeyFile())
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
