package guardtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testbin"
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

// serverBinary returns the path of a toxiproxy-server executable: the one
// on PATH, or else one built from toolsModule and kept in the user's
// cache directory for the next test processes.
func serverBinary() (string, error) {
	if p, err := exec.LookPath("toxiproxy-server"); err == nil {
		return p, nil
	}
	return testbin.Build(toolsModule, serverPackage, "toxiproxy-server")
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
	testbin.DieWithParent(cmd)
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
