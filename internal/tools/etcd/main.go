// Command etcd starts an etcd server for Sluice's tests: one member
// listening on the client and peer URLs and keeping its data in the
// directory given by flags, over TLS when the client URL is https (with
// -cert-file and -key-file, and -trusted-ca-file to require client
// certificates signed by that CA). It prints "ready" on standard output
// once it serves clients, and stops on SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	client := flag.String("client", "http://127.0.0.1:2379", "client URL")
	peer := flag.String("peer", "http://127.0.0.1:2380", "peer URL")
	dir := flag.String("data-dir", "default.etcd", "data directory")
	cert := flag.String("cert-file", "", "server certificate of an https client URL")
	key := flag.String("key-file", "", "server key of an https client URL")
	ca := flag.String("trusted-ca-file", "", "CA of the client certificates; set, clients must present one")
	flag.Parse()

	cu, err := url.Parse(*client)
	if err != nil {
		log.Fatalf("-client: %v", err)
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		log.Fatalf("-peer: %v", err)
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dir
	cfg.LogLevel = "error"
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	if cu.Scheme == "https" {
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: *cert, KeyFile: *key, TrustedCAFile: *ca, ClientCertAuth: *ca != ""}
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("start etcd: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		log.Fatal("etcd not ready after 60s")
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Printf("etcd: %v", err)
	}
	e.Close()
}
