package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/sluicehq/sluice/bench/loadgen"
)

// tlsFlags are the flags of TLS to the server.
type tlsFlags struct {
	ca, cert, key string
	insecure      bool
}

// config returns the TLS configuration of a run of target against addr,
// nil for plain TCP, and addr as loadgen takes it. TLS is spoken when a
// flag asks for it or addr (each of several) is an https:// URL; the gRPC
// and Envoy targets dial host:port, so they take the URL's scheme off.
func (f tlsFlags) config(target, addr string) (*tls.Config, string, error) {
	secure := f.ca != "" || f.insecure || f.cert != "" || strings.Contains(addr, "https://")
	if !secure {
		return nil, addr, nil
	}
	if target != loadgen.TargetHTTP {
		addr = strings.ReplaceAll(addr, "https://", "")
		if strings.Contains(addr, "://") {
			return nil, "", fmt.Errorf("--addr %q: want host:port or https://host:port with TLS", addr)
		}
	}
	if (f.cert == "") != (f.key == "") {
		return nil, "", errors.New("--tls-cert and --tls-key go together")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.insecure}
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, "", fmt.Errorf("--tls-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("--tls-ca %q: no PEM certificate in it", f.ca)
		}
	}
	if f.cert != "" {
		cert, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, "", fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, addr, nil
}
