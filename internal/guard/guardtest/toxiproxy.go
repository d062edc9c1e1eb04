package guardtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// toolsModule is the directory, relative to the root of the main module,
// of the module that pins the version of toxiproxy the tests build when
// toxiproxy-server is not on PATH. It is a module of its own so that
// toxiproxy and its dependencies stay out of the library's go.mod.
const toolsModule = "internal/tools/toxiproxy"

// serverPackage is the package of toxiproxy-server in that module.
const serverPackage = "github.com/Shopify/toxiproxy/v2/cmd/server"

// installHint says how to get toxiproxy-server when the tests cannot.
const installHint = "run `make deps`, which builds it from " + toolsModule + " into the user's cache directory " +
	"(it needs the Go module proxy), or put toxiproxy-server on PATH: a release from " +
	"https://github.com/Shopify/toxiproxy/releases, or `cd " + toolsModule +
	" && go build -o \"$(go env GOPATH)/bin/toxiproxy-server\" " + serverPackage + "`"

var (
	binaryOnce sync.Once
	binaryPath string
	binaryErr  error
)

// serverBinary returns the path of a toxiproxy-server executable: the one
// on PATH, or else one built once per test process from toolsModule and
// kept in the user's cache directory, keyed by that module's go.mod and
// go.sum, for the next test processes.
func serverBinary() (string, error) {
	binaryOnce.Do(func() {
		if p, err := exec.LookPath("toxiproxy-server"); err == nil {
			binaryPath = p
			return
		}
		binaryPath, binaryErr = buildServer()
	})
	return binaryPath, binaryErr
}

// buildServer builds toxiproxy-server from toolsModule into the cache, or
// returns the one built there before.
func buildServer() (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find the main module with `go env GOMOD`: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	dir := filepath.Join(root, filepath.FromSlash(toolsModule))
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", fmt.Errorf("read the module that pins toxiproxy: %w", err)
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	cache = filepath.Join(cache, "sluice")
	name := "toxiproxy-server-" + hex.EncodeToString(h.Sum(nil))[:16] + "-" + runtime.GOOS + "-" + runtime.GOARCH
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	bin := filepath.Join(cache, name)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("create the cache directory: %w", err)
	}
	// Build beside the final name and rename, so that test processes
	// building at the same time never run a half-written file.
	tmp, err := os.CreateTemp(cache, name+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("create the build output: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-o", tmp.Name(), serverPackage)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s in %s: %w\n%s", serverPackage, toolsModule, err, out)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", fmt.Errorf("move the built toxiproxy-server into the cache: %w", err)
	}
	return bin, nil
}

// startServer starts a toxiproxy-server process whose API listens on a
// free port of 127.0.0.1, waits until it answers, and stops it when the
// test ends. It returns the API's base URL.
func startServer(t testing.TB) string {
	t.Helper()
	bin, err := serverBinary()
	if err != nil {
		t.Fatalf("guardtest: no toxiproxy-server: %v\n%s", err, installHint)
	}
	var last error
	// The free port is found by listening and closing, so another process
	// may take it before the server does: try a few ports.
	for range 3 {
		api, err := tryStart(t, bin)
		if err == nil {
			return api
		}
		last = err
	}
	t.Fatalf("guardtest: start %s: %v", bin, last)
	return ""
}

// tryStart starts the server on one free port.
func tryStart(t testing.TB, bin string) (string, error) {
	port, err := freePort()
	if err != nil {
		return "", err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "-host", "127.0.0.1", "-port", strconv.Itoa(port))
	cmd.Env = append(os.Environ(), "LOG_LEVEL=error")
	cmd.Stdout = &stderr // its log, shown when it fails to start
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	api := "http://127.0.0.1:" + strconv.Itoa(port)
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			return "", fmt.Errorf("exited at start (%w): %s", err, bytes.TrimSpace(stderr.Bytes()))
		default:
		}
		if resp, err := client.Get(api + "/version"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Cleanup(stop)
				return api, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", errors.New("API not answering after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// freePort returns a port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
