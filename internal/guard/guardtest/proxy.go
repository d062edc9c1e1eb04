package guardtest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is a real TCP proxy (toxiproxy, run in this process on a free
// port) between a client and a server, into which tests inject latency,
// stalls and bandwidth limits.
type Proxy struct {
	p *toxiproxy.Proxy
}

// StartProxy starts a proxy to upstream (host:port) on a free port of
// 127.0.0.1; it stops when the test ends.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	// Some toxics log through zerolog's global logger, at trace level:
	// silence it for the test process.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "upstream", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("guardtest: start toxiproxy: %v", err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{p: p}
}

// Addr returns the address clients connect to.
func (p *Proxy) Addr() string { return p.p.Listen }

// Upstream returns the address of the server behind the proxy.
func (p *Proxy) Upstream() string { return p.p.Upstream }

// add adds a toxic of typ with the JSON attributes attrs to both
// directions, named after typ.
func (p *Proxy) add(t testing.TB, typ, stream, attrs string) {
	t.Helper()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, typ+"_"+stream, typ, stream, attrs)
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		t.Fatalf("guardtest: toxic %s: %v", js, err)
	}
}

// Latency delays every chunk of data by ms milliseconds, in the direction
// from the server to the client (every reply waits that long).
func (p *Proxy) Latency(t testing.TB, ms int) {
	p.add(t, "latency", "downstream", fmt.Sprintf(`{"latency":%d}`, ms))
}

// Stall stops all data from the server, without closing connections:
// requests go out and no reply ever comes, as in a network partition or a
// server paused by DEBUG SLEEP.
func (p *Proxy) Stall(t testing.TB) {
	p.add(t, "timeout", "downstream", `{"timeout":0}`)
}

// Bandwidth limits the data from the server to kbps kilobytes per second.
func (p *Proxy) Bandwidth(t testing.TB, kbps int) {
	p.add(t, "bandwidth", "downstream", fmt.Sprintf(`{"rate":%d}`, kbps))
}

// Clear removes every toxic: traffic flows freely again.
func (p *Proxy) Clear(t testing.TB) {
	t.Helper()
	p.p.Toxics.ResetToxics(context.Background())
}
