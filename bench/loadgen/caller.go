// The callers of the HTTP JSON, gRPC and Envoy targets, and their requests.

package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// newCaller returns the caller of cfg.Target and the function that
// releases it.
func newCaller(cfg *Config, r *run) (caller, func(), error) {
	switch cfg.Target {
	case TargetHTTP:
		base := httpBase(cfg.Addr, cfg.TLS != nil)
		tr := &http.Transport{
			TLSClientConfig:     cfg.TLS.Clone(),
			MaxIdleConns:        cfg.Concurrency,
			MaxIdleConnsPerHost: cfg.Concurrency,
			MaxConnsPerHost:     cfg.Concurrency,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		}
		path := "/api/v1/check"
		if cfg.Batch > 1 {
			path = "/api/v1/batch-check"
		}
		return &httpCaller{r: r, url: strings.TrimSuffix(base, "/") + path, client: &http.Client{Transport: tr}},
			tr.CloseIdleConnections, nil
	case TargetGRPC, TargetEnvoy:
		switch cfg.GRPCClient {
		case ClientH2:
			return newH2Caller(cfg, r)
		case ClientXNet:
			return newXNetCaller(cfg, r)
		}
		conns := make([]*grpc.ClientConn, cfg.Conns)
		closeAll := func() {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}
		for i := range conns {
			creds := insecure.NewCredentials()
			if cfg.TLS != nil {
				creds = credentials.NewTLS(cfg.TLS.Clone())
			}
			c, err := grpc.NewClient(cfg.Addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("loadgen: %w", err)
			}
			conns[i] = c
		}
		if cfg.Target == TargetEnvoy {
			g := &envoyCaller{r: r}
			for _, c := range conns {
				g.clients = append(g.clients, rlsv3.NewRateLimitServiceClient(c))
			}
			return g, closeAll, nil
		}
		g := &grpcCaller{r: r}
		for _, c := range conns {
			g.clients = append(g.clients, sluicev1.NewRateLimiterClient(c))
		}
		return g, closeAll, nil
	}
	return nil, nil, fmt.Errorf("loadgen: unknown target %q", cfg.Target)
}

// httpBase returns the base URL of the HTTP API at addr, host:port (an
// https URL when secure) or a URL.
func httpBase(addr string, secure bool) string {
	switch {
	case strings.Contains(addr, "://"):
		return addr
	case secure:
		return "https://" + addr
	}
	return "http://" + addr
}

type httpCaller struct {
	r      *run
	url    string
	client *http.Client
}

func (h *httpCaller) call(ctx context.Context, w *worker, key int, cost int64) (bool, error) {
	cfg := &h.r.cfg
	b := w.buf[:0]
	b = append(b, `{"client_id":`...)
	b = strconv.AppendQuote(b, h.r.keyNames[key])
	if cfg.Batch > 1 {
		b = append(b, `,"mode":"all_or_nothing","checks":[`...)
		for i := range cfg.Batch {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"resource":`...)
			b = strconv.AppendQuote(b, cfg.Resource+"/"+strconv.Itoa(i))
			b = append(b, `,"cost":`...)
			b = strconv.AppendInt(b, cost, 10)
			b = append(b, '}')
		}
		b = append(b, "]}"...)
	} else {
		b = append(b, `,"resource":`...)
		b = strconv.AppendQuote(b, h.r.resource(key))
		b = append(b, `,"cost":`...)
		b = strconv.AppendInt(b, cost, 10)
		b = append(b, '}')
	}
	w.buf = b
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(b))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return false, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusTooManyRequests:
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}
	err = httpError(resp)
	resp.Body.Close()
	return false, err
}

// httpError returns the error of an answer that is neither a verdict:
// its status and the reason the body gives (Sluice's error and
// error_description, or the start of any other body).
func httpError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	io.Copy(io.Discard, resp.Body)
	var e struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		if e.Description == "" {
			return fmt.Errorf("HTTP %d %s", resp.StatusCode, e.Error)
		}
		return fmt.Errorf("HTTP %d %s: %s", resp.StatusCode, e.Error, e.Description)
	}
	if b := strings.TrimSpace(string(body[:min(len(body), 200)])); b != "" {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.ToValidUTF8(b, "?"))
	}
	return fmt.Errorf("HTTP %d", resp.StatusCode)
}

type grpcCaller struct {
	r       *run
	clients []sluicev1.RateLimiterClient
	next    atomic.Uint32
}

func (g *grpcCaller) call(ctx context.Context, w *worker, key int, cost int64) (bool, error) {
	cfg := &g.r.cfg
	c := g.clients[int(g.next.Add(1))%len(g.clients)]
	if cfg.Batch > 1 {
		resp, err := c.BatchCheck(ctx, w.batchRequest(cfg, g.r.keyNames[key], cost))
		if err != nil {
			return false, err
		}
		return resp.GetAllowed(), nil
	}
	resp, err := c.CheckRateLimit(ctx, w.checkRequest(g.r.resource(key), g.r.keyNames[key], cost))
	if err != nil {
		return false, err
	}
	return resp.GetAllowed(), nil
}

// checkRequest returns w's CheckRequest, set for resource, key and cost.
// A unary call has marshalled its request when it returns, so one message
// serves all of w's calls.
func (w *worker) checkRequest(resource, key string, cost int64) *sluicev1.CheckRequest {
	if w.grpcReq == nil {
		w.grpcReq = &sluicev1.CheckRequest{Cost: new(int64)}
	}
	w.grpcReq.Resource = resource
	w.grpcReq.ClientId = key
	*w.grpcReq.Cost = cost
	return w.grpcReq
}

// batchRequest returns w's BatchCheckRequest of cfg.Batch checks, set for
// key and cost.
func (w *worker) batchRequest(cfg *Config, key string, cost int64) *sluicev1.BatchCheckRequest {
	if w.batchReq == nil {
		checks := make([]*sluicev1.CheckRequest, cfg.Batch)
		for i := range checks {
			checks[i] = &sluicev1.CheckRequest{Resource: cfg.Resource + "/" + strconv.Itoa(i), Cost: new(int64)}
		}
		w.batchReq = &sluicev1.BatchCheckRequest{Mode: sluicev1.BatchMode_BATCH_MODE_ALL_OR_NOTHING, Checks: checks}
	}
	w.batchReq.ClientId = key
	for _, c := range w.batchReq.Checks {
		*c.Cost = cost
	}
	return w.batchReq
}

// envoyRequest returns w's RateLimitRequest: one descriptor
// {cfg.DescriptorKey: key}, hits_addend cost.
func (w *worker) envoyRequest(cfg *Config, key string, cost int64) *rlsv3.RateLimitRequest {
	if w.envoyReq == nil {
		w.envoyEntry = &ratelimitv3.RateLimitDescriptor_Entry{Key: cfg.DescriptorKey}
		w.envoyReq = &rlsv3.RateLimitRequest{Domain: cfg.Domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{w.envoyEntry}}}}
	}
	w.envoyEntry.Value = key
	w.envoyReq.HitsAddend = uint32(cost)
	return w.envoyReq
}

type envoyCaller struct {
	r       *run
	clients []rlsv3.RateLimitServiceClient
	next    atomic.Uint32
}

func (g *envoyCaller) call(ctx context.Context, w *worker, key int, cost int64) (bool, error) {
	cfg := &g.r.cfg
	c := g.clients[int(g.next.Add(1))%len(g.clients)]
	resp, err := c.ShouldRateLimit(ctx, w.envoyRequest(cfg, g.r.keyNames[key], cost))
	if err != nil {
		return false, err
	}
	return envoyVerdict(resp.GetOverallCode())
}

// envoyVerdict returns whether Envoy's overall code admits the request:
// OK does, OVER_LIMIT does not, anything else is an error.
func envoyVerdict(code rlsv3.RateLimitResponse_Code) (bool, error) {
	switch code {
	case rlsv3.RateLimitResponse_OK:
		return true, nil
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return false, nil
	}
	return false, fmt.Errorf("envoy: overall code %s", code)
}

// message returns w's gRPC request for key with cost.
func (r *run) message(w *worker, key int, cost int64) proto.Message {
	cfg := &r.cfg
	switch {
	case cfg.Target == TargetEnvoy:
		return w.envoyRequest(cfg, r.keyNames[key], cost)
	case cfg.Batch > 1:
		return w.batchRequest(cfg, r.keyNames[key], cost)
	}
	return w.checkRequest(r.resource(key), r.keyNames[key], cost)
}

// verdict turns a gRPC reply's field 1 into the request's verdict.
func (r *run) verdict(v uint64, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	if r.cfg.Target != TargetEnvoy {
		return v == 1, nil // allowed
	}
	return envoyVerdict(rlsv3.RateLimitResponse_Code(v))
}
