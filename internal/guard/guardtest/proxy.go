package guardtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// Proxy is a real TCP proxy (a toxiproxy-server process, started on free
// ports of 127.0.0.1) between a client and a server, into which tests
// inject latency, stalls and bandwidth limits through toxiproxy's HTTP API.
type Proxy struct {
	api      string // base URL of the server's HTTP API
	name     string
	listen   string
	upstream string
	client   *http.Client
}

// proxyName is the name of the one proxy each server holds.
const proxyName = "upstream"

// StartProxy starts a proxy to upstream (host:port) on a free port of
// 127.0.0.1, in a toxiproxy-server process of its own; the process stops
// when the test ends. The test fails, saying how to get toxiproxy-server,
// when it can be neither found on PATH nor built.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	api := startServer(t)
	p := &Proxy{api: api, name: proxyName, client: &http.Client{Timeout: 10 * time.Second}}
	var created struct {
		Listen   string `json:"listen"`
		Upstream string `json:"upstream"`
	}
	body := map[string]any{"name": p.name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": true}
	if err := p.call(http.MethodPost, "/proxies", body, http.StatusCreated, &created); err != nil {
		t.Fatalf("guardtest: create proxy to %s: %v", upstream, err)
	}
	p.listen, p.upstream = created.Listen, created.Upstream
	return p
}

// Addr returns the address clients connect to.
func (p *Proxy) Addr() string { return p.listen }

// Upstream returns the address of the server behind the proxy.
func (p *Proxy) Upstream() string { return p.upstream }

// add adds a toxic of typ with the attributes attrs to the direction
// stream ("upstream" or "downstream"), named after both.
func (p *Proxy) add(t testing.TB, typ, stream string, attrs map[string]int) {
	t.Helper()
	toxic := map[string]any{"name": typ + "_" + stream, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs}
	if err := p.call(http.MethodPost, "/proxies/"+p.name+"/toxics", toxic, http.StatusOK, nil); err != nil {
		t.Fatalf("guardtest: toxic %s %s %v: %v", typ, stream, attrs, err)
	}
}

// Latency delays every chunk of data by ms milliseconds, in the direction
// from the server to the client (every reply waits that long).
func (p *Proxy) Latency(t testing.TB, ms int) {
	t.Helper()
	p.add(t, "latency", "downstream", map[string]int{"latency": ms})
}

// Stall stops all data from the server, without closing connections:
// requests go out and no reply ever comes, as in a network partition or a
// server paused by DEBUG SLEEP.
func (p *Proxy) Stall(t testing.TB) {
	t.Helper()
	p.add(t, "timeout", "downstream", map[string]int{"timeout": 0})
}

// Bandwidth limits the data from the server to kbps kilobytes per second.
func (p *Proxy) Bandwidth(t testing.TB, kbps int) {
	t.Helper()
	p.add(t, "bandwidth", "downstream", map[string]int{"rate": kbps})
}

// Disable cuts the proxy off: its connections are closed and new ones
// refused, as a network partition would, until Enable.
func (p *Proxy) Disable(t testing.TB) {
	t.Helper()
	p.setEnabled(t, false)
}

// Enable undoes Disable: the proxy accepts connections again.
func (p *Proxy) Enable(t testing.TB) {
	t.Helper()
	p.setEnabled(t, true)
}

func (p *Proxy) setEnabled(t testing.TB, on bool) {
	t.Helper()
	if err := p.call(http.MethodPost, "/proxies/"+p.name, map[string]any{"enabled": on}, http.StatusOK, nil); err != nil {
		t.Fatalf("guardtest: set proxy enabled %v: %v", on, err)
	}
}

// Clear removes every toxic: traffic flows freely again.
func (p *Proxy) Clear(t testing.TB) {
	t.Helper()
	// The server holds this proxy only, so resetting the server's state
	// removes this proxy's toxics and nothing else.
	if err := p.call(http.MethodPost, "/reset", nil, http.StatusNoContent, nil); err != nil {
		t.Fatalf("guardtest: clear toxics: %v", err)
	}
}

// call sends a request with the JSON body in (none when nil) to path of
// the API, expects the status want and decodes the reply into out (unless
// nil).
func (p *Proxy) call(method, path string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		js, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, p.api+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: read reply: %w", method, path, err)
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, want, bytes.TrimSpace(reply))
	}
	if out != nil {
		if err := json.Unmarshal(reply, out); err != nil {
			return fmt.Errorf("%s %s: decode reply %q: %w", method, path, reply, err)
		}
	}
	return nil
}
