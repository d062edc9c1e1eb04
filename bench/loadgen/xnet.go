// The gRPC and Envoy targets' caller over golang.org/x/net/http2's Transport.

package loadgen

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"

	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"
)

// xnetCaller sends unary gRPC calls through golang.org/x/net/http2's
// Transport, one Transport (and so one connection) per Config.Conns, over
// TLS when Config.TLS is set and over plain TCP (h2c) otherwise.
type xnetCaller struct {
	r      *run
	url    string
	header http.Header // the same for every request, read only
	trs    []*http2.Transport
	next   atomic.Uint32
}

func newXNetCaller(cfg *Config, r *run) (caller, func(), error) {
	scheme := "http"
	if cfg.TLS != nil {
		scheme = "https"
	}
	x := &xnetCaller{r: r, url: scheme + "://" + cfg.Addr + callPath(cfg), header: http.Header{
		"Content-Type": {"application/grpc"}, "Te": {"trailers"}, "User-Agent": {"sluice-load"},
	}}
	for range cfg.Conns {
		tr := &http2.Transport{
			// One connection per Transport: calls beyond the server's
			// bound on the streams of a connection wait for one to end.
			StrictMaxConcurrentStreams: true,
			DisableCompression:         true,
		}
		if cfg.TLS != nil {
			tr.TLSClientConfig = cfg.TLS.Clone()
		} else {
			// HTTP/2 over plain TCP: the Transport's TLS dial made plain.
			tr.AllowHTTP = true
			tr.DialTLSContext = func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}
		}
		x.trs = append(x.trs, tr)
	}
	closeAll := func() {
		for _, tr := range x.trs {
			tr.CloseIdleConnections()
		}
	}
	return x, closeAll, nil
}

// callPath returns the path of the method cfg calls.
func callPath(cfg *Config) string {
	switch {
	case cfg.Target == TargetEnvoy:
		return pathShouldRateLimit
	case cfg.Batch > 1:
		return pathBatchCheck
	}
	return pathCheckRateLimit
}

func (x *xnetCaller) call(ctx context.Context, w *worker, key int, cost int64) (bool, error) {
	tr := x.trs[int(x.next.Add(1))%len(x.trs)]
	b, err := proto.MarshalOptions{}.MarshalAppend(append(w.buf[:0], 0, 0, 0, 0, 0), x.r.message(w, key, cost))
	if err != nil {
		return false, err
	}
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-5))
	// The server answers a unary call once it has read the request, so
	// w.buf is free again when the reply has been read.
	w.buf = b
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, x.url, bytes.NewReader(b))
	if err != nil {
		return false, err
	}
	req.Header = x.header
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return false, err
	}
	w.resp, err = readAll(w.resp[:0], resp.Body)
	resp.Body.Close()
	if err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("http2: status %d", resp.StatusCode)
	}
	// A reply without a message carries its status in its headers.
	status, msg := resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message")
	if status == "" {
		status, msg = resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
	}
	if status != "0" {
		if status == "" {
			return false, fmt.Errorf("http2: reply without grpc-status")
		}
		code, _ := strconv.Atoi(status)
		return false, fmt.Errorf("rpc error: code = %d desc = %s", code, msg)
	}
	return x.r.verdict(field1(w.resp))
}

// readAll appends what r holds to b.
func readAll(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}
