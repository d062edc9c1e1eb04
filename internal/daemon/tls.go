// TLS on the daemon's listeners: the serving certificate, reloaded when its
// files change, and the optional client CA of mutual TLS.

package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TLSError is the error of a TLS file of the listeners (Config.TLSCertFile,
// TLSKeyFile, TLSClientCAFile) or of the connections to NATS
// (Config.SyncCAFile, SyncCertFile, SyncKeyFile): missing, unreadable, not
// PEM, or a key that is not the certificate's.
type TLSError struct {
	// Option is the name of the Config field, such as TLSCertFile.
	Option string
	// File is the file the option names; empty when it is missing.
	File string
	// Err says what is wrong.
	Err error
}

// Error names the option, the file and what is wrong.
func (e *TLSError) Error() string {
	if e.File != "" {
		return fmt.Sprintf("daemon: TLS: %s %q: %v", e.Option, e.File, e.Err)
	}
	return fmt.Sprintf("daemon: TLS: %s: %v", e.Option, e.Err)
}

// Unwrap returns Err.
func (e *TLSError) Unwrap() error { return e.Err }

// servingCert is the certificate the listeners present, read from its
// files at start and again when they change. Its methods are safe for
// concurrent use.
type servingCert struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
	failed            atomic.Bool // the last reload failed
}

// loadServingCert reads the certificate and key files; the error names the
// file at fault.
func loadServingCert(certFile, keyFile string) (*servingCert, error) {
	sc := &servingCert{certFile: certFile, keyFile: keyFile}
	if err := sc.reload(); err != nil {
		return nil, err
	}
	return sc, nil
}

// reload reads the files again and, when they hold a certificate and its
// key, serves them from the next handshake on; otherwise the certificate in
// force stays and the error names the file at fault.
func (sc *servingCert) reload() error {
	cert, err := readKeyPair("TLS", sc.certFile, sc.keyFile)
	sc.failed.Store(err != nil)
	if err != nil {
		return err
	}
	sc.cur.Store(cert)
	return nil
}

// register exports the certificate's expiry and whether its last reload
// worked on reg.
func (sc *servingCert) register(reg prometheus.Registerer) error {
	expiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_tls_cert_expiry_timestamp_seconds",
		Help: "Unix time at which the listeners' TLS certificate in force expires.",
	}, func() float64 {
		if leaf := sc.cur.Load().Leaf; leaf != nil {
			return float64(leaf.NotAfter.Unix())
		}
		return 0
	})
	ok := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_tls_cert_last_reload_successful",
		Help: "1 when the last reading of the listeners' TLS certificate and key worked, 0 when it failed (the pair read before stays in force).",
	}, func() float64 {
		if sc.failed.Load() {
			return 0
		}
		return 1
	})
	for _, c := range []prometheus.Collector{expiry, ok} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("daemon: TLS metrics: %w", err)
		}
	}
	return nil
}

// readKeyPair reads a certificate and its key; a *TLSError names the file
// at fault and its option, prefix followed by CertFile or KeyFile.
func readKeyPair(prefix, certFile, keyFile string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, &TLSError{Option: prefix + "CertFile", File: certFile, Err: err}
	}
	if _, err := parseCerts(certPEM); err != nil {
		return nil, &TLSError{Option: prefix + "CertFile", File: certFile, Err: err}
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, &TLSError{Option: prefix + "KeyFile", File: keyFile, Err: err}
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, &TLSError{Option: prefix + "KeyFile", File: keyFile,
			Err: fmt.Errorf("not a private key of the certificate %q: %w", certFile, err)}
	}
	return &cert, nil
}

// getCertificate is tls.Config.GetCertificate: the certificate in force.
func (sc *servingCert) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return sc.cur.Load(), nil
}

// startTLS reads the listeners' certificate, key and client CA when
// Config.TLSCertFile asks for TLS, and sets d.tls, the configuration every
// listener serves with (each clones it). It leaves d.tls nil without TLS.
func (d *Daemon) startTLS() error {
	cfg := &d.cfg
	switch {
	case cfg.TLSCertFile == "" && cfg.TLSKeyFile == "" && cfg.TLSClientCAFile == "":
		return nil
	case cfg.TLSCertFile == "" && cfg.TLSKeyFile != "":
		return &TLSError{Option: "TLSCertFile", Err: fmt.Errorf("missing: the key %q needs its certificate", cfg.TLSKeyFile)}
	case cfg.TLSCertFile == "" && cfg.TLSClientCAFile != "":
		return &TLSError{Option: "TLSCertFile", Err: fmt.Errorf("missing: client certificates (%q) need TLS, a certificate and its key", cfg.TLSClientCAFile)}
	case cfg.TLSKeyFile == "":
		return &TLSError{Option: "TLSKeyFile", Err: fmt.Errorf("missing: the certificate %q needs its key", cfg.TLSCertFile)}
	}
	// The files are watched before they are read, so that a certificate
	// renewed meanwhile is not missed. A watch that cannot start (a
	// directory missing) is reported as the reading's error, which names
	// the file.
	var ws []*configWatcher
	closeAll := func() {
		for _, w := range ws {
			w.Close()
		}
	}
	for _, path := range []string{cfg.TLSCertFile, cfg.TLSKeyFile} {
		w, err := newWatcher(path)
		if err != nil {
			closeAll()
			if _, lerr := loadServingCert(cfg.TLSCertFile, cfg.TLSKeyFile); lerr != nil {
				return lerr
			}
			return fmt.Errorf("daemon: TLS: %w", err)
		}
		ws = append(ws, w)
	}
	sc, err := loadServingCert(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		closeAll()
		return err
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: sc.getCertificate}
	if cfg.TLSClientCAFile != "" {
		pool, err := loadCAs(cfg.TLSClientCAFile)
		if err != nil {
			closeAll()
			return &TLSError{Option: "TLSClientCAFile", File: cfg.TLSClientCAFile, Err: err}
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if err := sc.register(d.reg); err != nil {
		closeAll()
		return err
	}
	d.cert, d.certWatch, d.keyWatch, d.tls = sc, ws[0], ws[1], tc
	return nil
}

// watchCert reloads the serving certificate once changes in the
// directories of its files settle for the debounce interval (as the
// configuration's watch does), until ctx ends; it owns and closes the
// watchers of the certificate and of the key. A certificate and key that
// do not make a pair, as while one has been replaced and not yet the
// other, leave the one in force.
func (d *Daemon) watchCert(ctx context.Context, cert, key *configWatcher) {
	defer cert.Close()
	defer key.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case _, ok := <-cert.w.Events:
			if !ok {
				return
			}
			timer.Reset(d.cfg.WatchDebounce)
		case _, ok := <-key.w.Events:
			if !ok {
				return
			}
			timer.Reset(d.cfg.WatchDebounce)
		case err = <-cert.w.Errors:
		case err = <-key.w.Errors:
		case <-timer.C:
			cert.follow()
			key.follow()
			d.reloadCert()
		}
		if err != nil {
			d.log.Warn("TLS certificate watch error", "err", err)
		}
	}
}

// reloadCert reads the serving certificate again, if there is one, and
// logs the outcome.
func (d *Daemon) reloadCert() {
	if d.cert == nil {
		return
	}
	if err := d.cert.reload(); err != nil {
		d.log.Error("TLS certificate not reloaded; the one in force stays", "err", err)
		return
	}
	var expires time.Time
	if leaf := d.cert.cur.Load().Leaf; leaf != nil {
		expires = leaf.NotAfter
	}
	d.log.Info("TLS certificate loaded", "file", d.cert.certFile, "expires", expires)
}

// serveHTTP serves srv on ln, with TLS when the daemon has it, until srv
// is shut down.
func (d *Daemon) serveHTTP(srv *http.Server, ln net.Listener) error {
	if d.tls == nil {
		return srv.Serve(ln)
	}
	srv.TLSConfig = d.tls.Clone()
	return srv.ServeTLS(ln, "", "") // the certificate comes from GetCertificate
}

// closeCertWatch stops the certificate's watchers before they are handed
// to watchCert, when the start fails.
func (d *Daemon) closeCertWatch() {
	if d.certWatch != nil {
		d.certWatch.Close()
		d.keyWatch.Close()
	}
}
