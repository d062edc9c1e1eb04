// Command sluice is the Sluice rate limiter's one binary.
//
//	sluice serve [flags]            serve the HTTP, gRPC and Envoy APIs
//	sluice config validate PATH     check a configuration file or directory
//	sluice check [flags]            ask a running server for one decision
//	sluice load [flags]             load-test a running server
//	sluice admin COMMAND [flags]    use the admin API of a running server
//	sluice migrate --analytics URL  migrate the analytics' PostgreSQL
//	sluice version                  print the build's version and commit
//	sluice completion SHELL         print a completion script (bash, zsh, fish)
//
// Every flag has a matching SLUICE_* environment variable (the flag wins):
// SLUICE_FLAG for serve's, SLUICE_COMMAND_FLAG for the other commands'.
// Run `sluice help` or `sluice COMMAND -h` for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/buildinfo"
	"github.com/sluicehq/sluice/internal/daemon"
	"github.com/sluicehq/sluice/internal/logging"
	"github.com/sluicehq/sluice/internal/policy"
	"github.com/sluicehq/sluice/internal/share"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

const usage = `Usage:
  sluice serve [flags]              serve the HTTP, gRPC and Envoy rate limit APIs
  sluice config validate PATH...    check configuration files or directories; exit 1 on the first error
  sluice check [flags]              ask a running server for one decision (HTTP or Envoy's API)
  sluice load [flags]               load-test a running server (HTTP, gRPC or Envoy's API)
  sluice admin COMMAND [flags]      change rules, tiers, overrides, throttles and tokens through the admin API
  sluice migrate --analytics URL    bring the analytics schema of a PostgreSQL to this build's version
  sluice version                    print the version, commit, build date and Go version
  sluice completion bash|zsh|fish   print a shell completion script

Run "sluice COMMAND -h" for a command's flags.
`

// run runs the command line args and returns the exit code.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stdout, stderr, getenv)
	case "config":
		if len(args) == 2 && isHelp(args[1]) {
			fmt.Fprint(stdout, configUsage)
			return 0
		}
		if len(args) < 2 || args[1] != "validate" {
			fmt.Fprint(stderr, configUsage)
			return 2
		}
		return validate(args[2:], stdout, stderr, getenv)
	case "check":
		return check(args[1:], stdout, stderr, getenv)
	case "load":
		return load(args[1:], stdout, stderr, getenv)
	case "admin":
		return admin(args[1:], os.Stdin, stdout, stderr, getenv)
	case "migrate":
		return migrate(args[1:], stdout, stderr, getenv)
	case "completion":
		return completion(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, buildinfo.Read())
		return 0
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

func serve(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: sluice serve [flags]\n\nServes the HTTP, gRPC and Envoy rate limit APIs. Every flag has an environment\nvariable (env), read when the flag is not given.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	configPath := fs.String("config", "", "policy file, Sluice's YAML or envoyproxy/ratelimit's, or a directory of envoyproxy/ratelimit files (*.yaml, *.yml), one domain each; empty serves the built-in example policy")
	mergeDomains := fs.Bool("merge-domain-config", false, "let several files of a --config directory hold one Envoy domain and merge their descriptors, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG; without it such a configuration is rejected")
	storeURL := fs.String("store", daemon.DefaultStoreURL, "store: memory://, redis://host:port[/db], redis-cluster://host:port,host:port,... (rediss:// and rediss-cluster:// for TLS) or redis-sentinel://host:26379,.../master[/db]")
	httpAddr := fs.String("http-addr", daemon.DefaultHTTPAddr, "listen address of the HTTP JSON API")
	grpcAddr := fs.String("grpc-addr", daemon.DefaultGRPCAddr, "listen address of the gRPC and Envoy APIs")
	grpcReadTimeout := fs.Duration("grpc-read-timeout", 0, "how long a unary gRPC call may take to send its request (message and half-close) after its headers; it then ends with DeadlineExceeded; 0 or negative: no bound (costs each call about 5% more CPU; for clients you do not trust)")
	grpcKeepalive := fs.Duration("grpc-keepalive", daemon.DefaultGRPCKeepalive, "how long a gRPC connection may receive nothing before the server pings the client, closing the connection when the ping is not answered within 20s (or this, when shorter); negative: no pings")
	grpcMaxAge := fs.Duration("grpc-max-connection-age", daemon.DefaultGRPCMaxConnectionAge, "how long a gRPC connection may live (spread by +/-10%): then the server asks the client to reconnect, lets its calls finish (10s at most) and closes it, so that Envoys spread their checks over instances added by a scale-up; negative: no maximum")
	grpcMaxConns := fs.Int("grpc-max-conns", daemon.DefaultGRPCMaxConns, "gRPC connections open at once at most; at the bound the one idle the longest (no call for 1s) is closed, and when none is idle new ones wait; negative: no bound")
	grpcReflection := fs.Bool("grpc-reflection", false, "serve gRPC server reflection on the gRPC address, for tools such as grpcurl (it lists every service and message to whoever reaches the address)")
	envoyCompat := fs.Bool("envoy-compat", false, "answer Envoy's rate limit API as envoyproxy/ratelimit does where Sluice differs: descriptors decided each on its own, refused hits counted (fixed windows), limit_remaining 0 when over the limit, a descriptor with no entries not limited (docs/api.md); set it alike on every instance sharing a store")
	bulkShare := fs.Float64("bulk-share", share.DefaultShare, "share of the time and of the CPUs that requests of more than --bulk-checks checks (batches, Envoy calls) may take while smaller ones are in progress (or were in the last 10ms): they then wait between slices of their work, never past half of their deadline, so that one client's large batches do not slow the others' checks; 1: no bound")
	bulkChecks := fs.Int("bulk-checks", share.DefaultBulkChecks, "most checks (or Envoy descriptors) of a request that --bulk-share leaves alone")
	noReservations := fs.Bool("no-reservations", false, "do not serve reservations of capacity (/api/v1/reserve and the reservation_id of checks; on a Redis store their pools live in Redis, shared by every instance)")
	envoyPreciseReset := fs.Bool("envoy-precise-reset", false, "report Envoy's duration_until_reset to the microsecond instead of in whole seconds (envoyproxy/ratelimit's)")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	debugAddr := fs.String("debug-addr", "", "listen address of the debug listener (pprof, /metrics); empty: none; loopback only unless --debug-allow-remote")
	debugRemote := fs.Bool("debug-allow-remote", false, "let --debug-addr listen on a non-loopback address")
	gcPercent := fs.Int("gc-percent", 400, "Go garbage collector target percentage when GOGC is not set (0 or less: Go's default, 100): higher trades memory for less CPU per check (see docs/operations.md)")
	exitOnUnavailable := fs.Bool("exit-on-unavailable-store", false, "exit at start when the Redis store does not answer; by default the server starts, decides checks by the rules' failure modes, reports not ready on /readyz and gRPC health, and connects when Redis comes up")
	shutdownDelay := fs.Duration("shutdown-delay", 0, "on SIGINT or SIGTERM, how long to keep serving while not ready (/readyz 503, gRPC health NOT_SERVING) before closing the listeners, for load balancers to stop sending checks first (a few seconds under Kubernetes); 0: none")
	shutdownTimeout := fs.Duration("shutdown-timeout", 15*time.Second, "how long a graceful shutdown waits for checks in flight")
	otlpEndpoint := fs.String("otlp-endpoint", "", "host:port of an OpenTelemetry collector receiving the checks' spans over OTLP/gRPC (plain TCP), such as localhost:4317; empty: no tracing")
	traceRatio := fs.Float64("trace-sample-ratio", 0.01, "share of checks traced, 0 to 1, among those whose caller sent no W3C traceparent; a caller's trace is followed, sampled or not (with --otlp-endpoint)")
	guardCfg := guardFlags(fs)
	redisOpts := redisFlags(fs)
	controlOpts := controlFlags(fs)
	analyticsOpts := analyticsFlags(fs)
	tlsOpts := serveTLSFlags(fs)
	fromEnv := envFlags(fs, sluiceEnv(fs))
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if err := fromEnv(getenv); err != nil {
		fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice serve: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := checkURLFlags(fs); err != nil {
		fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		return 2
	}
	if *shutdownTimeout < 0 {
		fmt.Fprintf(stderr, "sluice serve: --shutdown-timeout %s: want 0 or more\n", *shutdownTimeout)
		return 2
	}
	if r := *traceRatio; !(r >= 0 && r <= 1) {
		fmt.Fprintf(stderr, "sluice serve: --trace-sample-ratio %v: want 0 to 1\n", r)
		return 2
	}
	if *shutdownDelay < 0 {
		fmt.Fprintf(stderr, "sluice serve: --shutdown-delay %s: want 0 or more\n", *shutdownDelay)
		return 2
	}
	logger, err := logging.New(stderr, *logFormat, *logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "sluice serve: --log-format/--log-level: %v\n", err)
		return 2
	}
	if getenv("GOGC") == "" && *gcPercent > 0 {
		debug.SetGCPercent(*gcPercent)
	}

	// Signals are subscribed before the listeners open, so that none is
	// missed once the daemon serves.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	cfg := daemon.Config{
		HTTPAddr:     *httpAddr,
		GRPCAddr:     *grpcAddr,
		ConfigPath:   *configPath,
		MergeDomains: *mergeDomains,
		StoreURL:     *storeURL,
		Logger:       logger,
		Guard:        guardCfg(),
		Redis:        redisOpts(),

		GRPCReadTimeout:      *grpcReadTimeout,
		GRPCMaxConns:         *grpcMaxConns,
		GRPCKeepalive:        *grpcKeepalive,
		GRPCMaxConnectionAge: *grpcMaxAge,
		GRPCReflection:       *grpcReflection,

		EnvoyCompat:       *envoyCompat,
		EnvoyPreciseReset: *envoyPreciseReset,
		NoReservations:    *noReservations,
		BulkShare:         *bulkShare,
		BulkChecks:        *bulkChecks,

		ExitOnUnavailableStore: *exitOnUnavailable,
		ShutdownDelay:          *shutdownDelay,

		DebugAddr:        *debugAddr,
		DebugAllowRemote: *debugRemote,

		OTLPEndpoint:     *otlpEndpoint,
		TraceSampleRatio: *traceRatio,
	}
	analyticsOpts(&cfg)
	tlsOpts(&cfg)
	if err := controlOpts(&cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		return 1
	}
	startCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	d, err := daemon.Start(startCtx, cfg)
	cancel()
	if err != nil {
		logger.Error("cannot start", "err", flagError(err))
		return 1
	}
	for sig := range sigs {
		if sig == syscall.SIGHUP {
			logger.Info("SIGHUP: reloading the configuration")
			d.Reload() // logs its own errors
			continue
		}
		logger.Info("shutting down", "signal", sig.String())
		ctx, cancel := context.WithTimeout(context.Background(), *shutdownDelay+*shutdownTimeout)
		err := d.Shutdown(ctx)
		cancel()
		if err != nil {
			logger.Error("shutdown", "err", err)
			return 1
		}
		return 0
	}
	return 0
}

const (
	configUsage   = "Usage: sluice config validate [--merge-domain-config] PATH...\n"
	validateUsage = configUsage + `
Checks configuration files or directories and exits 1 at the first invalid
one, naming the file and the field.

Flags:
`
)

func validate(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("config validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), validateUsage); fs.PrintDefaults() }
	merge := fs.Bool("merge-domain-config", false, "let several files of a directory hold one Envoy domain, merged (as serve's flag)")
	fromEnv := envFlags(fs, sluiceEnv(fs))
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if err := fromEnv(getenv); err != nil {
		fmt.Fprintf(stderr, "sluice config validate: %v\n", err)
		return 2
	}
	files := fs.Args()
	if len(files) == 0 {
		fmt.Fprint(stderr, configUsage)
		return 2
	}
	for _, f := range files {
		p, err := policy.LoadWith(f, policy.Options{MergeDomains: *merge})
		if err != nil {
			var ce *policy.ConfigError
			if errors.As(err, &ce) || strings.HasPrefix(err.Error(), f) {
				fmt.Fprintln(stderr, err)
			} else {
				fmt.Fprintf(stderr, "%s: %v\n", f, err)
			}
			return 1
		}
		fmt.Fprintf(stdout, "%s: valid (version %s)\n", f, p.Version)
	}
	return 0
}
