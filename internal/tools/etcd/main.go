// Command etcd-embedded runs an etcd server in one process, for Sluice's
// tests: go.etcd.io/etcd/server/v3/embed on the URLs and data directory
// its flags give. It prints "ready" on standard output once it serves.
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

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dir := flag.String("data-dir", "", "data directory")
	client := flag.String("client-url", "http://127.0.0.1:2379", "client URL")
	peer := flag.String("peer-url", "http://127.0.0.1:2380", "peer URL")
	name := flag.String("name", "sluice-test", "member name")
	flag.Parse()

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dir
	cfg.LogLevel = "error"
	cu, err := url.Parse(*client)
	if err != nil {
		log.Fatal(err)
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		log.Fatal(err)
	}
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Println("ready")
	case <-time.After(30 * time.Second):
		e.Server.Stop()
		log.Fatal("etcd did not become ready in 30s")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Fatal(err)
	}
}
