// Command nats starts a NATS server with JetStream for Sluice's tests: it
// listens on 127.0.0.1 at the port given by -port and keeps JetStream's
// files in -store-dir, so that a server restarted on the same directory
// still has its streams. With -tlscert and -tlskey it speaks TLS only, and
// with -tlscacert it requires client certificates that CA signs. It prints "ready" on standard output once it
// accepts clients, and stops on SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	port := flag.Int("port", 4222, "client port")
	dir := flag.String("store-dir", "", "JetStream's storage directory")
	verbose := flag.Bool("v", false, "log the server's notices")
	cert := flag.String("tlscert", "", "PEM file of the server's certificate: TLS only")
	key := flag.String("tlskey", "", "PEM file of the key of -tlscert")
	ca := flag.String("tlscacert", "", "PEM file of the CA whose client certificates are required")
	flag.Parse()
	if *dir == "" {
		log.Fatal("-store-dir is required")
	}

	opts := &server.Options{
		ServerName: "sluice-test",
		Host:       "127.0.0.1",
		Port:       *port,
		JetStream:  true,
		StoreDir:   *dir,
		NoSigs:     true,
		// Tests run on a small machine: 256 MiB of each is plenty.
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  256 << 20,
	}
	if *cert != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: *cert, KeyFile: *key, CaFile: *ca, Verify: *ca != ""})
		if err != nil {
			log.Fatalf("nats: TLS: %v", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify = tc, true, *ca != ""
	}
	s, err := server.NewServer(opts)
	if err != nil {
		log.Fatalf("nats: %v", err)
	}
	if *verbose {
		s.ConfigureLogger()
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		log.Fatal("nats: not ready after 30s")
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	s.Shutdown()
	s.WaitForShutdown()
}
