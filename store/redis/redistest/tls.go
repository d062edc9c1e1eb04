package redistest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testbin"
)

// PKI is a certificate authority made for one test, and the certificates it
// signed for a server and a client, written as PEM files in t.TempDir().
// Nothing of it outlives the test.
type PKI struct {
	// CAFile is the CA's certificate.
	CAFile string
	// ServerCertFile and ServerKeyFile are the server's certificate and
	// key. The certificate holds the IP address 127.0.0.1 and the DNS
	// name ServerName.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate (for
	// mutual TLS) and its key.
	ClientCertFile, ClientKeyFile string
	// ServerName is the DNS name in the server's certificate, which
	// resolves nowhere: a client that dials 127.0.0.1 and verifies that
	// name must be told it.
	ServerName string
}

// NewPKI makes a CA, a server certificate and a client certificate, all
// ECDSA P-256 and valid for a day, and writes them to t.TempDir(). Two
// calls make two unrelated CAs.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	p := &PKI{
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"),
		ServerKeyFile:  filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
		ServerName:     "redis.test",
	}
	now := time.Now()
	caKey := newKey(t)
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("redistest: CA certificate: %v", err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		t.Fatalf("redistest: CA certificate: %v", err)
	}
	writePEM(t, p.CAFile, "CERTIFICATE", caDER)
	leaf := func(serial int64, name string, usage []x509.ExtKeyUsage, certFile, keyFile string, ips []net.IP, dns []string) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
			IPAddresses:  ips,
			DNSNames:     dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatalf("redistest: %s certificate: %v", name, err)
		}
		writePEM(t, certFile, "CERTIFICATE", der)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatalf("redistest: %s key: %v", name, err)
		}
		writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	}
	// The server's certificate is also its client certificate when it
	// dials the other nodes of a cluster over TLS.
	leaf(2, "redistest server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, p.ServerCertFile, p.ServerKeyFile,
		[]net.IP{net.IPv4(127, 0, 0, 1)}, []string{p.ServerName})
	leaf(3, "redistest client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, p.ClientCertFile, p.ClientKeyFile, nil, nil)
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("redistest: key: %v", err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// TLSOptions configures the TLS port of a server started by StartTLS.
type TLSOptions struct {
	// PKI holds the server's certificate and key, and the CA whose
	// client certificates the server accepts; nil means NewPKI(t).
	PKI *PKI
	// AuthClients makes the server require a client certificate signed
	// by the PKI's CA (tls-auth-clients yes); otherwise it asks for none.
	AuthClients bool
}

// StartTLS starts a standalone redis-server that also listens for TLS on
// Server.TLSAddr, with the certificate of opts.PKI (which it sets when
// nil), and returns it once it answers PING. Addr stays a plain port, for
// Do and the other helpers. When the installed redis-server was built
// without TLS, the test is skipped.
func StartTLS(t testing.TB, opts *TLSOptions) *Server {
	t.Helper()
	skipWithoutTLS(t)
	return start(t, opts.args(t), true)
}

// args returns the TLS settings of a server, and sets PKI when nil.
func (o *TLSOptions) args(t testing.TB) []string {
	if o.PKI == nil {
		o.PKI = NewPKI(t)
	}
	auth := "no"
	if o.AuthClients {
		auth = "yes"
	}
	return []string{
		"--tls-cert-file", o.PKI.ServerCertFile,
		"--tls-key-file", o.PKI.ServerKeyFile,
		"--tls-ca-cert-file", o.PKI.CAFile,
		"--tls-auth-clients", auth,
	}
}

// skipWithoutTLS skips t when redis-server does not know TLS's
// directives: told to listen on no port, plain or TLS, a server built
// with TLS reads its configuration and then exits for having nowhere to
// listen; one built without refuses the tls-port directive.
func skipWithoutTLS(t testing.TB) {
	t.Helper()
	bin := lookPath(t, "redis-server")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--port", "0", "--tls-port", "0", "--save", "", "--appendonly", "no")
	testbin.DieWithParent(cmd)
	cmd.Dir = t.TempDir()
	out, _ := cmd.CombinedOutput()
	if strings.Contains(string(out), "Bad directive") {
		t.Skipf("redistest: the installed redis-server has no TLS support (built without BUILD_TLS): %s", strings.TrimSpace(string(out)))
	}
}
