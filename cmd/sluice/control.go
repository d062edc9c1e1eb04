package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/daemon"
)

// controlFlags defines serve's flags of the control plane and the admin
// API; the function it returns fills them into cfg, generating an admin
// token for a loopback listener when no tokens file is given (printed to
// w, once).
func controlFlags(fs *flag.FlagSet) func(cfg *daemon.Config, w io.Writer) error {
	dataDir := fs.String("data-dir", "", "local data directory: the control plane's rules, tiers, overrides and throttles when --config-store is empty (one instance), and the last configuration applied from etcd, served after a restart while etcd is down; empty with no --config-store: no control plane (the admin API says how to turn it on)")
	store := fs.String("config-store", "", "the control plane's shared store for many instances: etcd://host:2379[,host:2379...][/prefix] (etcds:// for TLS; user:password@ for etcd's authentication)")
	storeCA := fs.String("config-store-ca", "", "PEM file of the CAs that sign the etcds:// store's certificates, trusted instead of the system's roots")
	storeCert := fs.String("config-store-cert", "", "PEM file of a client certificate for an etcds:// store that requires one (with --config-store-key)")
	storeKey := fs.String("config-store-key", "", "PEM file of the key of --config-store-cert")
	instance := fs.String("instance", "", "this instance's name in the control plane; empty: host name and process id")
	region := fs.String("region", "", "this instance's region: for emergency throttles of scope region, and the name under which --sync shares its counts")
	syncURL := fs.String("sync", "", "share the counts of global limits with the other regions through NATS JetStream: nats://host:4222[,nats://host:4222...]; needs --region (see docs/multi-region.md)")
	syncPeers := fs.String("sync-peers", "", "the other regions sharing global limits, comma-separated: each counts at its share of each limit until heard from; empty: learned from their messages")
	tokens := fs.String("admin-tokens", "", "file of admin tokens by SHA-256 hash, each with a role (viewer, operator or admin); see docs/operations.md. Without it, a listener on loopback gets a generated admin token, printed at start")
	adminAddr := fs.String("admin-addr", "", "serve the admin API on this address instead of the HTTP API's")
	requireToken := fs.Bool("require-check-token", false, "the check APIs (HTTP, gRPC, Envoy's) require a token of any role, as \"Authorization: Bearer TOKEN\"")
	return func(cfg *daemon.Config, w io.Writer) error {
		cfg.DataDir, cfg.ControlStore = *dataDir, *store
		cfg.ControlCAFile, cfg.ControlCertFile, cfg.ControlKeyFile = *storeCA, *storeCert, *storeKey
		cfg.Instance, cfg.Region, cfg.SyncURL = *instance, *region, *syncURL
		if *syncPeers != "" {
			cfg.SyncPeers = strings.Split(*syncPeers, ",")
		}
		cfg.AdminTokensPath, cfg.AdminAddr, cfg.RequireCheckToken = *tokens, *adminAddr, *requireToken
		if cfg.AdminTokensPath != "" || (cfg.DataDir == "" && cfg.ControlStore == "") {
			return nil
		}
		addr := cfg.AdminAddr
		if addr == "" {
			addr = cfg.HTTPAddr
		}
		if !daemon.IsLoopback(addr) {
			return nil
		}
		token, _, err := auth.Generate()
		if err != nil {
			return err
		}
		cfg.AdminToken = token
		fmt.Fprintf(w, "admin API on %s: a token for this run (admin role, loopback only): export SLUICE_TOKEN=%s\n", addr, token)
		return nil
	}
}
