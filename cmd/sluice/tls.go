package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/sluicehq/sluice/internal/daemon"
)

// tlsFlags names serve's flags of the listeners' TLS by daemon.Config
// field, for tlsFlagError.
var tlsFlags = map[string]string{
	"TLSCertFile":     "tls-cert",
	"TLSKeyFile":      "tls-key",
	"TLSClientCAFile": "tls-client-ca",
	"SyncCAFile":      "sync-ca",
	"SyncCertFile":    "sync-cert",
	"SyncKeyFile":     "sync-key",
}

// serveTLSFlags are serve's flags of TLS on the listeners and to NATS, and
// of the operators' headers.
type serveTLSFlags struct {
	Cert              string `name:"tls-cert" placeholder:"FILE" env:"SLUICE_TLS_CERT" help:"PEM file of the certificate (and its intermediates) every listener serves TLS 1.2+ with: HTTP API, gRPC and Envoy APIs, admin and debug listeners; read again when it changes; empty: plain TCP"`
	Key               string `name:"tls-key" placeholder:"FILE" env:"SLUICE_TLS_KEY" help:"PEM file of the private key of --tls-cert"`
	ClientCA          string `name:"tls-client-ca" placeholder:"FILE" env:"SLUICE_TLS_CLIENT_CA" help:"PEM file of the CAs of client certificates: every listener then requires a client certificate they sign (mutual TLS); needs --tls-cert"`
	SyncCA            string `name:"sync-ca" placeholder:"FILE" env:"SLUICE_SYNC_CA" help:"PEM file of the CAs that sign the NATS servers' certificates of --sync, trusted instead of the system's roots; speaks TLS to NATS (tls://host:4222 alone uses the system's roots)"`
	SyncCert          string `name:"sync-cert" placeholder:"FILE" env:"SLUICE_SYNC_CERT" help:"PEM file of a client certificate for NATS servers that verify clients (with --sync-key)"`
	SyncKey           string `name:"sync-key" placeholder:"FILE" env:"SLUICE_SYNC_KEY" help:"PEM file of the key of --sync-cert"`
	NoOperatorHeaders bool   `name:"no-operator-headers" env:"SLUICE_NO_OPERATOR_HEADERS" help:"leave out of HTTP check answers the headers meant for operators (decision source and latency, rule and tier names, throttle, shadow), for end-user-facing deployments; the standard RateLimit, X-RateLimit-Limit/-Remaining/-Reset and Retry-After headers stay"`
}

// fill sets the TLS fields of cfg.
func (f *serveTLSFlags) fill(cfg *daemon.Config) {
	cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSClientCAFile = f.Cert, f.Key, f.ClientCA
	cfg.SyncCAFile, cfg.SyncCertFile, cfg.SyncKeyFile = f.SyncCA, f.SyncCert, f.SyncKey
	cfg.NoOperatorHeaders = f.NoOperatorHeaders
}

// tlsFlagError names the flag and file of a listener TLS error; ok is
// false for other errors.
func tlsFlagError(err error) (_ error, ok bool) {
	var te *daemon.TLSError
	if !errors.As(err, &te) {
		return err, false
	}
	name := tlsFlags[te.Option]
	if te.File != "" {
		return fmt.Errorf("--%s %q: %w", name, te.File, te.Err), true
	}
	return fmt.Errorf("--%s: %w", name, te.Err), true
}

// clientTLSFlags are the flags of the commands that dial a server (check,
// admin) for a server that serves TLS (serve's --tls-cert): HTTP speaks
// it to an https:// address, gRPC with check's --tls or any of these
// flags. Their variables are shared by those commands, as SLUICE_ADDR is.
type clientTLSFlags struct {
	CA                 string `name:"tls-ca" placeholder:"FILE" env:"SLUICE_TLS_CA" help:"PEM file of the CAs that sign the server's certificate, trusted instead of the system's roots"`
	ClientCert         string `name:"tls-client-cert" placeholder:"FILE" env:"SLUICE_TLS_CLIENT_CERT" help:"PEM file of a client certificate, for a server that requires one (serve's --tls-client-ca); needs --tls-client-key"`
	ClientKey          string `name:"tls-client-key" placeholder:"FILE" env:"SLUICE_TLS_CLIENT_KEY" help:"PEM file of the private key of --tls-client-cert"`
	InsecureSkipVerify bool   `name:"insecure-skip-verify" env:"SLUICE_INSECURE_SKIP_VERIFY" help:"accept any server certificate, unverified (for tests only: anyone between can read and change the traffic)"`
}

// any reports whether any of the flags is set: they then ask for TLS to a
// gRPC address.
func (f *clientTLSFlags) any() bool {
	return f.CA != "" || f.ClientCert != "" || f.ClientKey != "" || f.InsecureSkipVerify
}

// config returns the TLS configuration of the flags; an error names the
// flag and its file.
func (f *clientTLSFlags) config() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.InsecureSkipVerify}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %q: no PEM certificate in the file", f.CA)
		}
	}
	switch {
	case f.ClientCert != "" && f.ClientKey != "":
		cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-cert %q, --tls-client-key %q: %w", f.ClientCert, f.ClientKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	case f.ClientCert != "":
		return nil, errors.New("--tls-client-cert needs --tls-client-key")
	case f.ClientKey != "":
		return nil, errors.New("--tls-client-key needs --tls-client-cert")
	}
	return tc, nil
}
