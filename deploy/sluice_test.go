package deploy_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/daemon"
)

// The packaging tests check what the Dockerfile, the compose file and the
// Kubernetes manifests give `sluice serve` against the binary itself: its
// flags and SLUICE_* variables as `sluice serve --help` lists them, its
// default addresses, its probe paths, and `sluice config validate` on the
// configuration files they mount.

var bin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bin.dir != "" {
		os.RemoveAll(bin.dir)
	}
	os.Exit(code)
}

// sluiceBinary builds cmd/sluice once per test process into a temporary
// directory and returns its path.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	bin.once.Do(func() {
		bin.dir, bin.err = os.MkdirTemp("", "sluice-deploy-")
		if bin.err != nil {
			return
		}
		bin.path = filepath.Join(bin.dir, "sluice")
		out, err := exec.Command("go", "build", "-o", bin.path, "../cmd/sluice").CombinedOutput()
		if err != nil {
			bin.err = fmt.Errorf("go build ./cmd/sluice: %v\n%s", err, out)
		}
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
	return bin.path
}

// serveCLI is what `sluice serve --help` says the command takes.
type serveCLI struct {
	flags map[string]bool // flag names, without dashes
	env   map[string]bool // SLUICE_* variables
}

var (
	helpFlag = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--?([a-z][a-z0-9-]*)`)
	helpEnv  = regexp.MustCompile(`\bSLUICE_[A-Z0-9_]+\b`)
)

var serveHelp struct {
	once sync.Once
	cli  serveCLI
	out  string
}

// serveFlags returns the flags and variables of the built binary's
// `sluice serve`, read from its help.
func serveFlags(t *testing.T) serveCLI {
	t.Helper()
	path := sluiceBinary(t)
	serveHelp.once.Do(func() {
		// The exit code is not this test's concern: the help is.
		out, _ := exec.Command(path, "serve", "--help").CombinedOutput()
		serveHelp.out = string(out)
		cli := serveCLI{flags: map[string]bool{}, env: map[string]bool{}}
		for _, m := range helpFlag.FindAllStringSubmatch(serveHelp.out, -1) {
			cli.flags[m[1]] = true
		}
		for _, v := range helpEnv.FindAllString(serveHelp.out, -1) {
			cli.env[v] = true
		}
		serveHelp.cli = cli
	})
	cli := serveHelp.cli
	if len(cli.flags) < 10 || len(cli.env) < 10 || !cli.flags["config"] || !cli.env["SLUICE_STORE"] {
		t.Fatalf("sluice serve --help: %d flags, %d variables read from:\n%s", len(cli.flags), len(cli.env), serveHelp.out)
	}
	return cli
}

// invocation is how a deployment runs `sluice serve`: the arguments after
// "serve", and the environment (the image's, then the deployment's).
type invocation struct {
	where string
	args  []string
	env   map[string]string
}

// settings checks every flag and SLUICE_* variable of inv against the
// binary and returns the value each flag takes: the command line's, else
// its variable's, else nothing (the binary's default). Flags are written
// --name=value (or --name alone for a boolean), so that they read the same
// to people and to this test.
func (cli serveCLI) settings(t *testing.T, inv invocation) map[string]string {
	t.Helper()
	got := map[string]string{}
	for name, value := range inv.env {
		if !strings.HasPrefix(name, "SLUICE_") {
			continue
		}
		if !cli.env[name] {
			t.Errorf("%s: environment variable %s: sluice serve has none such", inv.where, name)
			continue
		}
		got[strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "SLUICE_")), "_", "-")] = value
	}
	for _, arg := range inv.args {
		if !strings.HasPrefix(arg, "-") {
			t.Errorf("%s: argument %q: want flags only, as --name=value", inv.where, arg)
			continue
		}
		name, value, ok := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !ok {
			value = "true"
		}
		if !cli.flags[name] {
			t.Errorf("%s: flag --%s: sluice serve has none such", inv.where, name)
			continue
		}
		got[name] = value
	}
	return got
}

// listenPorts returns the HTTP and gRPC ports that settings s listen on,
// and checks that they listen on every interface, as a container must.
func listenPorts(t *testing.T, where string, s map[string]string) (httpPort, grpcPort string) {
	t.Helper()
	port := func(flag, def string) string {
		addr := s[flag]
		if addr == "" {
			addr = def
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("%s: --%s=%s: %v", where, flag, addr, err)
			return ""
		}
		if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
			t.Errorf("%s: --%s=%s listens on loopback only: unreachable from outside the container", where, flag, addr)
		}
		return port
	}
	return port("http-addr", daemon.DefaultHTTPAddr), port("grpc-addr", daemon.DefaultGRPCAddr)
}

// validateConfig runs `sluice config validate` on a configuration given as
// its contents; name is the file's name (its extension matters).
func validateConfig(t *testing.T, where, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sluiceBinary(t), "config", "validate", path).CombinedOutput()
	if err != nil {
		t.Errorf("%s: sluice config validate: %v\n%s", where, err, out)
	}
	return path
}

// serveAddr matches the HTTP address in the log line of a started server,
// as text (http=127.0.0.1:41234) or JSON ("http":"127.0.0.1:41234").
var serveAddr = regexp.MustCompile(`\bhttp"?[=:]"?([^\s",}]+)`)

// startSluice starts the binary as `sluice serve` with args and env on
// loopback ports the system picks, and returns the base URL of its HTTP
// API once it serves. The server is stopped when the test ends.
func startSluice(t *testing.T, args []string, env []string) string {
	t.Helper()
	args = append(append([]string{"serve"}, args...), "--http-addr=127.0.0.1:0", "--grpc-addr=127.0.0.1:0")
	cmd := exec.Command(sluiceBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	addr := make(chan string, 1)
	var log strings.Builder
	var mu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			log.WriteString(line + "\n")
			mu.Unlock()
			if strings.Contains(line, "listening") {
				if m := serveAddr.FindStringSubmatch(line); m != nil {
					select {
					case addr <- m[1]:
					default:
					}
				}
			}
		}
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	select {
	case a := <-addr:
		host, port, _ := net.SplitHostPort(a)
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			host = "127.0.0.1"
		}
		return "http://" + net.JoinHostPort(host, port)
	case <-exited:
	case <-time.After(30 * time.Second):
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("sluice %s: no \"listening\" line with its HTTP address; its log:\n%s", strings.Join(args, " "), log.String())
	return ""
}

// getOK asks base+path and reports an answer other than 200, retrying for
// a few seconds while the server gets ready.
func getOK(t *testing.T, where, base, path string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get(base + path)
		if err != nil {
			last = err.Error()
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		last = resp.Status
	}
	t.Errorf("%s: GET %s: %s, want 200 OK", where, path, last)
}
