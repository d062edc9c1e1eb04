// Command sluice-load is Sluice's load generator: it sends checks to a
// running Sluice server (its HTTP JSON API, its gRPC API or Envoy's
// ShouldRateLimit) for a bounded time and prints what the server answered
// and how fast. See package loadgen for what it measures and how.
//
//	sluice-load --target http --addr 127.0.0.1:8080 --duration 10s
//
// Every flag has a matching SLUICE_LOAD_* environment variable (the flag
// wins). Run `sluice-load -h` for the flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bench/loadgen"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// run runs the load generator against a running server and prints its
// report. It returns the exit code: 0 after a run, 1 when the run had
// errors or overshot --expect-limit or the server could not be reached,
// and 2 on usage errors.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("sluice-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: sluice-load [flags]

Sends checks to a running Sluice server for a bounded time and prints the
throughput, allowed/denied/error counts and the latency percentiles of the
answered requests (errors, timeouts included, are left out of them). Every
flag has an environment variable (env), read when the flag is not given.

Examples:
  sluice-load --target http  --addr 127.0.0.1:8080 --duration 10s --concurrency 64
  sluice-load --target envoy --addr 127.0.0.1:8081 --domain load --descriptor-key client_id
  sluice-load --target grpc  --addr 127.0.0.1:8081 --rate 5000 --keys 100000 --zipf
  sluice-load --all-at-once --concurrency 1000 --keys 1 --expect-limit 100 --window 1h
  sluice-load --addr eu:8080,us:8080,ap:8080 --split 60,30,10 --keys 10 --expect-limit 1000 --window 1m
  sluice-load --target grpc  --addr sluice.example:8081 --tls-ca ca.pem
  sluice-load --target http  --addr https://sluice.example:8080

Flags:
`)
		fs.PrintDefaults()
	}
	var cfg loadgen.Config
	fs.StringVar(&cfg.Target, "target", "http", "API to drive: http (JSON API), grpc (Sluice's gRPC API) or envoy (Envoy's ShouldRateLimit)")
	fs.StringVar(&cfg.Addr, "addr", "", "server address host:port; default 127.0.0.1:8080 for http, 127.0.0.1:8081 for grpc and envoy. Several, comma-separated: one server per region, driven at once on the same keys (see --split), the report comparing what all admitted with --expect-limit, a global limit")
	split := fs.String("split", "", "with several --addr, each region's part of the callers and of --rate, such as 60,30,10; empty: equal parts")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "concurrent callers")
	fs.Float64Var(&cfg.Rate, "rate", 0, "total requests per second (open loop, latency from each request's due time); 0: closed loop at full speed")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to send requests (at most 1h); those in flight then are answered and counted")
	fs.Int64Var(&cfg.Requests, "requests", 0, "stop after this many requests; 0: only --duration bounds the run")
	fs.IntVar(&cfg.Keys, "keys", 1000, "distinct keys (client ids, or descriptor values for envoy)")
	fs.BoolVar(&cfg.Zipf, "zipf", false, "draw keys from a Zipf distribution (key 0 hottest) instead of uniformly")
	fs.Float64Var(&cfg.ZipfS, "zipf-s", 1.1, "Zipf exponent, > 1")
	costs := fs.String("costs", "1", "cost mix cost:weight,... such as 1:90,5:9,10:1")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", "load-", "prefix of the key names; empty: the key numbers alone")
	fs.StringVar(&cfg.Resource, "resource", "/api/v1/orders", "resource of http and grpc checks; empty: checks that name none")
	fs.IntVar(&cfg.Resources, "resources", 0, "spread single checks over this many resources: key k checks resource/(k mod N), for a policy of one rule per resource (http and grpc); 0: --resource alone")
	fs.IntVar(&cfg.Batch, "batch", 0, "send all-or-nothing batches of this many checks of one key to resource/0, resource/1, ... (http and grpc)")
	fs.StringVar(&cfg.Domain, "domain", "sluice", "Envoy domain")
	fs.StringVar(&cfg.DescriptorKey, "descriptor-key", "client_id", "Envoy descriptor entry key; the value is the key name")
	fs.IntVar(&cfg.Conns, "conns", 2, "gRPC connections shared by the callers")
	fs.StringVar(&cfg.GRPCClient, "grpc-client", loadgen.ClientH2, "client of the grpc and envoy targets: h2 (lean, the default), x-net (golang.org/x/net/http2) or grpc-go")
	fs.DurationVar(&cfg.Timeout, "timeout", time.Second, "deadline of each request")
	fs.Int64Var(&cfg.ExpectLimit, "expect-limit", 0, "cost the server should admit per key per --window; reports the overshoot")
	fs.DurationVar(&cfg.Window, "window", 0, "window of --expect-limit, aligned on the Unix epoch like fixed windows; 0: the whole run")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the key and cost draws")
	fs.BoolVar(&cfg.AllAtOnce, "all-at-once", false, "one burst: --concurrency requests, one per caller, released together once every caller is ready (--duration, --rate and --requests do not apply); with --keys 1 and --expect-limit the report gives admitted against the limit")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	quiet := fs.Bool("quiet", false, "print no progress on stderr while the run goes on (by default a line a second, or one line updated in place on a terminal)")
	cpuProfile := fs.String("cpuprofile", "", "write the load generator's own CPU profile to this file; empty: none")
	threads := fs.Int("threads", 0, "OS threads running the load generator's Go code (GOMAXPROCS); 0: Go's default, one per core. Beside the server on one machine, 1 leaves it the other cores: over gRPC in a closed loop one thread drives every caller")
	var tf tlsFlags
	fs.StringVar(&tf.ca, "tls-ca", "", "PEM file of the CAs that sign the server's certificate, trusted instead of the system's roots: speaks TLS to the server (so does an https:// --addr, with the system's roots)")
	fs.BoolVar(&tf.insecure, "insecure-skip-verify", false, "speak TLS to the server without verifying its certificate, for a test server only")
	fs.StringVar(&tf.cert, "tls-cert", "", "PEM file of a client certificate to present over TLS, for a server that requires one (--tls-client-ca); with --tls-key")
	fs.StringVar(&tf.key, "tls-key", "", "PEM file of the key of --tls-cert")
	gcPercent := fs.Int("gc-percent", 400, "Go garbage collector target percentage when GOGC is not set, 0 or less: Go's default, 100 (the generator's own CPU per request falls by about a quarter at 400)")
	fromEnv := envFlags(fs, "SLUICE_LOAD_")
	if code := parseFlags(fs, args, stdout, stderr); code >= 0 {
		return code
	}
	if err := fromEnv(getenv); err != nil {
		fmt.Fprintf(stderr, "sluice-load: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice-load: unexpected arguments %q\n", fs.Args())
		return 2
	}
	// loadgen.Config takes a zero for its default; here every default is
	// the flag's own, so a zero (or a negative value) is a mistake, not a
	// request for the default.
	for _, f := range []struct {
		name string
		bad  bool
		want string
	}{
		{"concurrency", cfg.Concurrency < 1 || cfg.Concurrency > loadgen.MaxConcurrency, fmt.Sprintf("1 to %d", loadgen.MaxConcurrency)},
		{"duration", cfg.Duration <= 0 || cfg.Duration > loadgen.MaxDuration, fmt.Sprintf("more than 0, at most %s", loadgen.MaxDuration)},
		{"keys", cfg.Keys < 1 || cfg.Keys > loadgen.MaxKeys, fmt.Sprintf("1 to %d", loadgen.MaxKeys)},
		{"timeout", cfg.Timeout <= 0, "more than 0"},
		{"conns", cfg.Conns < 1, "1 or more"},
		{"zipf-s", cfg.Zipf && !(cfg.ZipfS > 1), "more than 1"},
	} {
		if f.bad {
			fmt.Fprintf(stderr, "sluice-load: --%s %s: want %s\n", f.name, fs.Lookup(f.name).Value, f.want)
			return 2
		}
	}
	// loadgen.Config also takes an empty string for its default; an empty
	// value given here is the user's, kept where it means something
	// (--key-prefix, --resource, --cpuprofile) and refused where the run
	// cannot use it.
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, f := range []struct {
		name string
		bad  bool
		want string
	}{
		{"target", cfg.Target == "", "http, grpc or envoy"},
		{"addr", cfg.Addr == "", "host:port"},
		{"grpc-client", cfg.GRPCClient == "", "h2, x-net or grpc-go"},
		{"domain", cfg.Domain == "" && cfg.Target == loadgen.TargetEnvoy, "the Envoy domain, which Envoy requests require"},
		{"descriptor-key", cfg.DescriptorKey == "" && cfg.Target == loadgen.TargetEnvoy, "the descriptor entry key, which Envoy requests require"},
	} {
		if given[f.name] && f.bad {
			fmt.Fprintf(stderr, "sluice-load: --%s \"\": want %s\n", f.name, f.want)
			return 2
		}
	}
	var err error
	if cfg.Costs, err = loadgen.ParseCosts(*costs); err != nil {
		fmt.Fprintf(stderr, "sluice-load: --costs: %v\n", err)
		return 2
	}
	if cfg.TLS, cfg.Addr, err = tf.config(cfg.Target, cfg.Addr); err != nil {
		fmt.Fprintf(stderr, "sluice-load: %v\n", err)
		return 2
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:8080"
		if cfg.Target != loadgen.TargetHTTP {
			cfg.Addr = "127.0.0.1:8081"
		}
	}
	if *threads < 0 {
		fmt.Fprintf(stderr, "sluice-load: --threads: %d is negative\n", *threads)
		return 2
	}
	if *threads > 0 {
		runtime.GOMAXPROCS(*threads)
	}
	if getenv("GOGC") == "" && *gcPercent > 0 {
		debug.SetGCPercent(*gcPercent)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "sluice-load: --cpuprofile: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "sluice-load: --cpuprofile: %v\n", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	var endProgress func()
	if !*quiet && !cfg.AllAtOnce {
		cfg.Progress, endProgress = progressPrinter(stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var regions []*loadgen.Report
	var rep *loadgen.Report
	if strings.Contains(cfg.Addr, ",") || *split != "" {
		var rs []loadgen.Region
		if rs, err = loadgen.ParseRegions(cfg.Addr, *split); err != nil {
			fmt.Fprintf(stderr, "sluice-load: --addr, --split: %v\n", err)
			return 2
		}
		rep, regions, err = loadgen.RunRegions(ctx, cfg, rs)
	} else {
		rep, err = loadgen.Run(ctx, cfg)
	}
	if endProgress != nil {
		endProgress()
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice-load: %v\n", err)
		if errors.Is(err, loadgen.ErrInvalidConfig) {
			return 2
		}
		return 1 // the server cannot be reached
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if regions != nil {
			enc.Encode(struct {
				*loadgen.Report
				Regions []*loadgen.Report `json:"regions"`
			}{rep, regions})
		} else {
			enc.Encode(rep)
		}
	} else {
		rep.Text(stdout)
		for _, r := range regions {
			fmt.Fprintf(stdout, "region      %s: %d callers, %d requests, %d allowed, %d denied, %d errors, admitted %d units\n",
				r.Addr, r.Concurrency, r.Requests, r.Allowed, r.Denied, r.Errors, r.AdmittedCost)
		}
		if o := rep.Overshoot; regions != nil && o != nil {
			fmt.Fprintf(stdout, "global      admitted %d units in all regions against a global limit of %d per key per window (%d windows, %d keys over)\n",
				rep.AdmittedCost, o.ExpectLimit, o.Windows, o.KeysOver)
		}
	}
	if rep.Errors > 0 || (rep.Overshoot != nil && rep.Overshoot.Total > 0) {
		return 1
	}
	return 0
}

// progressPrinter returns the function that prints a run's progress to w,
// a line each call, or, when w is a terminal, one line rewritten in place,
// and the function that ends that line once the run is over.
func progressPrinter(w io.Writer) (func(loadgen.Progress), func()) {
	f, ok := w.(*os.File)
	tty := false
	if ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	print := func(p loadgen.Progress) {
		rate := 0.0
		if s := p.Elapsed.Seconds(); s > 0 {
			rate = float64(p.Requests) / s
		}
		line := fmt.Sprintf("load %4.0fs: %d checks, %.0f/s, %d allowed, %d denied, %d errors",
			p.Elapsed.Seconds(), p.Requests, rate, p.Allowed, p.Denied, p.Errors)
		if tty {
			fmt.Fprint(w, "\r\033[K", line)
			return
		}
		fmt.Fprintln(w, line)
	}
	end := func() {
		if tty {
			fmt.Fprint(w, "\r\033[K")
		}
	}
	return print, end
}
