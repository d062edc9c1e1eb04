package daemon_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// serverCloses reports whether the server closes conn (or answers and
// closes it) within d, reading whatever it sends meanwhile.
func serverCloses(conn net.Conn, d time.Duration) (bool, string) {
	conn.SetReadDeadline(time.Now().Add(d))
	got, err := io.ReadAll(conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false, string(got)
	}
	return true, string(got)
}

// TestSlowRequestBodyIsCutOff sends a request's headers and part of its
// body, then nothing: the server must not wait for the rest forever, each
// such connection holding a goroutine and its buffers.
func TestSlowRequestBodyIsCutOff(t *testing.T) {
	t.Parallel()
	td := start(t, policyText())
	conn, err := net.Dial("tcp", td.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"client_id":"slow","resource":"/api/limited"}`
	if _, err := io.WriteString(conn, "POST /api/v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"+
		"Content-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body[:10]); err != nil {
		t.Fatal(err)
	}
	closed, got := serverCloses(conn, 15*time.Second)
	if !closed {
		t.Fatalf("the connection of a request whose body stopped coming is still open after 15s (read %q)", got)
	}
	if !strings.HasPrefix(got, "HTTP/1.1 400") {
		t.Errorf("answer to a body that stopped coming: %q, want a 400", got)
	}
	// The check was not decided: nothing was consumed.
	if rem := td.remaining(t, "slow", "/api/limited", "per-client"); rem != 3 {
		t.Errorf("remaining after a cut-off request: %d, want 3", rem)
	}
}

// TestClientThatDoesNotReadIsCutOff pipelines requests and never reads the
// answers: once the socket buffers are full the server's writes block, and
// must not block forever.
func TestClientThatDoesNotReadIsCutOff(t *testing.T) {
	t.Parallel()
	td := start(t, policyText())
	conn, err := net.Dial("tcp", td.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// /metrics answers kilobytes: a few thousand answers fill the buffers
	// of both ends.
	wrote := make(chan error, 1)
	go func() {
		w := bufio.NewWriter(conn)
		for range 4000 {
			if _, err := w.WriteString("GET /metrics HTTP/1.1\r\nHost: sluice\r\n\r\n"); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- w.Flush()
	}()
	const wait = 18 * time.Second
	time.Sleep(wait)
	// Reading now drains what the server wrote: when it has given up on
	// the connection the read ends (EOF or a reset); when it is still
	// blocked it resumes, answers the rest, and waits for more requests.
	if closed, _ := serverCloses(conn, 5*time.Second); !closed {
		t.Errorf("a client that reads no answer still holds its connection after %s", wait)
	}
	<-wrote
	if r := get(t, td.base+"/healthz"); r.status != http.StatusOK {
		t.Errorf("healthz: %d", r.status)
	}
}
