package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

// A bad certificate or key of the listeners fails the start, naming the
// flag and the file.
func TestServeTLSBadFiles(t *testing.T) {
	pki, other := redistest.NewPKI(t), redistest.NewPKI(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--tls-cert", missing, "--tls-key", pki.ServerKeyFile}, nil, `--tls-cert "` + missing + `"`},
		{[]string{"--tls-cert", pki.ServerCertFile, "--tls-key", other.ServerKeyFile}, nil, `--tls-key "` + other.ServerKeyFile + `": not a private key of the certificate`},
		{[]string{"--tls-cert", pki.ServerCertFile}, nil, `--tls-key: missing`},
		{[]string{"--tls-cert", pki.ServerCertFile, "--tls-key", pki.ServerKeyFile}, map[string]string{"SLUICE_TLS_CLIENT_CA": missing}, `--tls-client-ca "` + missing + `"`},
	} {
		var out bytes.Buffer
		args := append([]string{"serve", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, tc.args...)
		code := run(args, &out, &out, func(k string) string { return tc.env[k] })
		// The log quotes the error: its quotes come escaped.
		if msg := strings.ReplaceAll(out.String(), `\"`, `"`); code != 1 || !strings.Contains(msg, tc.want) {
			t.Errorf("serve %q %v: exit %d, %q; want 1 and %q", tc.args, tc.env, code, out.String(), tc.want)
		}
	}
}
