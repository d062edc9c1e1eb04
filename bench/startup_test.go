package bench

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// binaries builds sluice and the reference hello server into dir.
func binaries(b *testing.B, dir string) (sluice, hello string) {
	// sluice is built in its own module (the parent directory), so that
	// this module need not list its dependencies.
	for _, p := range [][2]string{{"..", "./cmd/sluice"}, {".", "./internal/hello"}} {
		cmd := exec.Command("go", "build", "-o", dir, p[1])
		cmd.Dir = p[0]
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("go build %s: %v\n%s", p[1], err, out)
		}
	}
	return filepath.Join(dir, "sluice"), filepath.Join(dir, "hello")
}

// freeAddr returns a loopback address with a port that was free a moment
// ago.
func freeAddr(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// coldStart starts the binary with args (plus its listen address), and
// returns the time from starting the process to the first 200 answer to a
// check. It polls every 200 µs.
func coldStart(b *testing.B, bin string, args ...string) time.Duration {
	addr := freeAddr(b)
	args = append(args, "--http-addr", addr)
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	body := []byte(`{"client_id":"cold","resource":"/api/v1/demo"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	for ctx.Err() == nil {
		resp, err := client.Post("http://"+addr+"/api/v1/check", "application/json", bytes.NewReader(body))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start)
			}
			b.Fatalf("%s: first check answered %s", bin, resp.Status)
		}
		time.Sleep(200 * time.Microsecond)
	}
	b.Fatalf("%s: no answer within 10s", bin)
	return 0
}

// BenchmarkColdStart measures P-14: from starting `sluice serve` (memory
// store, built-in policy) to its first successful check, against the same
// for the smallest Go HTTP server (reference). It reports ms/start.
func BenchmarkColdStart(b *testing.B) {
	sluice, hello := binaries(b, b.TempDir())
	for _, tt := range []struct {
		name string
		bin  string
		args []string
	}{
		{"sluice-serve-memory", sluice, []string{"serve", "--grpc-addr", "127.0.0.1:0", "--log-level", "warn"}},
		{"go-http-hello", hello, nil},
	} {
		b.Run(tt.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				total += coldStart(b, tt.bin, tt.args...)
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/start")
		})
	}
}
