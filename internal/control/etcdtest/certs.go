package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Names of the PEM files a TLS server writes in its directory.
const (
	caFile         = "ca.pem"
	serverCertFile = "server.pem"
	serverKeyFile  = "server-key.pem"
	clientCertFile = "client.pem"
	clientKeyFile  = "client-key.pem"
)

// writeCerts makes a throwaway CA and, signed by it, a server certificate
// for 127.0.0.1 and localhost and a client certificate, and writes them
// with their keys as PEM files in dir.
func writeCerts(dir string) error {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcdtest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("etcdtest: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, caFile), "CERTIFICATE", caDER); err != nil {
		return err
	}
	for i, leaf := range []struct {
		cert, key string
		tmpl      x509.Certificate
	}{
		{serverCertFile, serverKeyFile, x509.Certificate{
			Subject:     pkix.Name{CommonName: "etcdtest server"},
			DNSNames:    []string{"localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}},
		{clientCertFile, clientKeyFile, x509.Certificate{
			Subject:     pkix.Name{CommonName: "etcdtest client"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		t := leaf.tmpl
		t.SerialNumber = big.NewInt(int64(i + 2))
		t.NotBefore, t.NotAfter = caTmpl.NotBefore, caTmpl.NotAfter
		t.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, &t, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("etcdtest: %s: %w", leaf.cert, err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, leaf.cert), "CERTIFICATE", der); err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, leaf.key), "PRIVATE KEY", keyDER); err != nil {
			return err
		}
	}
	return nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
