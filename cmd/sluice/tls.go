package main

import (
	"errors"
	"flag"
	"fmt"

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

// serveTLSFlags defines serve's flags of TLS on the listeners and to NATS,
// and of the operators' headers; the function it returns fills them into
// cfg.
func serveTLSFlags(fs *flag.FlagSet) func(cfg *daemon.Config) {
	cert := fs.String(tlsFlags["TLSCertFile"], "", "PEM file of the certificate (and its intermediates) every listener serves TLS 1.2+ with: HTTP API, gRPC and Envoy APIs, admin and debug listeners; read again when it changes; empty: plain TCP")
	key := fs.String(tlsFlags["TLSKeyFile"], "", "PEM file of the private key of --tls-cert")
	clientCA := fs.String(tlsFlags["TLSClientCAFile"], "", "PEM file of the CAs of client certificates: every listener then requires a client certificate they sign (mutual TLS); needs --tls-cert")
	syncCA := fs.String(tlsFlags["SyncCAFile"], "", "PEM file of the CAs that sign the NATS servers' certificates of --sync, trusted instead of the system's roots; speaks TLS to NATS (tls://host:4222 alone uses the system's roots)")
	syncCert := fs.String(tlsFlags["SyncCertFile"], "", "PEM file of a client certificate for NATS servers that verify clients (with --sync-key)")
	syncKey := fs.String(tlsFlags["SyncKeyFile"], "", "PEM file of the key of --sync-cert")
	noOps := fs.Bool("no-operator-headers", false, "leave out of HTTP check answers the headers meant for operators (decision source and latency, rule and tier names, throttle, shadow), for end-user-facing deployments; the standard RateLimit, X-RateLimit-Limit/-Remaining/-Reset and Retry-After headers stay")
	return func(cfg *daemon.Config) {
		cfg.TLSCertFile, cfg.TLSKeyFile, cfg.TLSClientCAFile = *cert, *key, *clientCA
		cfg.SyncCAFile, cfg.SyncCertFile, cfg.SyncKeyFile = *syncCA, *syncCert, *syncKey
		cfg.NoOperatorHeaders = *noOps
	}
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
