package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/sluicehq/sluice/internal/auth"
	"github.com/sluicehq/sluice/internal/daemon"
)

// controlFlags are serve's flags of the control plane and the admin API.
type controlFlags struct {
	DataDir           string `name:"data-dir" placeholder:"DIR" env:"SLUICE_DATA_DIR" help:"local data directory: the control plane's rules, tiers, overrides and throttles when --config-store is empty (one instance), and the last configuration applied from etcd, served after a restart while etcd is down; empty with no --config-store: no control plane (the admin API says how to turn it on)"`
	Store             string `name:"config-store" placeholder:"URL" env:"SLUICE_CONFIG_STORE" help:"the control plane's shared store for many instances: etcd://host:2379[,host:2379...][/prefix] (etcds:// for TLS; user:password@ for etcd's authentication)"`
	StoreCA           string `name:"config-store-ca" placeholder:"FILE" env:"SLUICE_CONFIG_STORE_CA" help:"PEM file of the CAs that sign the etcds:// store's certificates, trusted instead of the system's roots"`
	StoreCert         string `name:"config-store-cert" placeholder:"FILE" env:"SLUICE_CONFIG_STORE_CERT" help:"PEM file of a client certificate for an etcds:// store that requires one (with --config-store-key)"`
	StoreKey          string `name:"config-store-key" placeholder:"FILE" env:"SLUICE_CONFIG_STORE_KEY" help:"PEM file of the key of --config-store-cert"`
	Instance          string `name:"instance" placeholder:"NAME" env:"SLUICE_INSTANCE" help:"this instance's name in the control plane; empty: host name and process id"`
	Region            string `name:"region" placeholder:"NAME" env:"SLUICE_REGION" help:"this instance's region: for emergency throttles of scope region, and the name under which --sync shares its counts"`
	Sync              string `name:"sync" placeholder:"URL" env:"SLUICE_SYNC" help:"share the counts of global limits with the other regions through NATS JetStream: nats://host:4222[,nats://host:4222...]; needs --region (see docs/multi-region.md)"`
	SyncPeers         string `name:"sync-peers" placeholder:"REGION,..." env:"SLUICE_SYNC_PEERS" help:"the other regions sharing global limits, comma-separated: each counts at its share of each limit until heard from; empty: learned from their messages"`
	AdminTokens       string `name:"admin-tokens" placeholder:"FILE" env:"SLUICE_ADMIN_TOKENS" help:"file of admin tokens by SHA-256 hash, each with a role (viewer, operator or admin); see docs/operations.md. Without it, a listener on loopback gets a generated admin token, printed at start"`
	AdminAddr         string `name:"admin-addr" placeholder:"HOST:PORT" env:"SLUICE_ADMIN_ADDR" help:"serve the admin API on this address instead of the HTTP API's"`
	RequireCheckToken bool   `name:"require-check-token" env:"SLUICE_REQUIRE_CHECK_TOKEN" help:"the check APIs (HTTP, gRPC, Envoy's) require a token of any role, as \"Authorization: Bearer TOKEN\""`
}

// fill sets the control plane's fields of cfg, generating an admin token
// for a loopback listener when no tokens file is given (printed to w,
// once).
func (f *controlFlags) fill(cfg *daemon.Config, w io.Writer) error {
	cfg.DataDir, cfg.ControlStore = f.DataDir, f.Store
	cfg.ControlCAFile, cfg.ControlCertFile, cfg.ControlKeyFile = f.StoreCA, f.StoreCert, f.StoreKey
	cfg.Instance, cfg.Region, cfg.SyncURL = f.Instance, f.Region, f.Sync
	if f.SyncPeers != "" {
		cfg.SyncPeers = strings.Split(f.SyncPeers, ",")
	}
	cfg.AdminTokensPath, cfg.AdminAddr, cfg.RequireCheckToken = f.AdminTokens, f.AdminAddr, f.RequireCheckToken
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
