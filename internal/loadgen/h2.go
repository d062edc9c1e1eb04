package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// h2Conn is a lean client of unary gRPC calls over one HTTP/2 connection,
// the load generator's default for the gRPC and Envoy targets. It does
// only what a load generator needs: unary calls on one method, headers
// encoded once, the frames of concurrent calls gathered into one system
// call by a writer goroutine, and the reply's field 1 (overall_code, or
// allowed) read without unmarshalling the whole message. grpc-go's client does far more
// per call (interceptors, retries, balancing, a goroutine hand-off each
// way) and on a small machine took as much CPU per call as the server it
// measured; Config.GRPCClient selects it instead.
//
// The frame layer is golang.org/x/net/http2's Framer and HPACK codec; this
// type keeps the streams, the flow-control windows and the gRPC framing.
type h2Conn struct {
	nc net.Conn
	fr *http2.Framer
	// The request header blocks: first adds the headers to the server's
	// HPACK table, every later request refers to them there.
	first, header []byte

	wmu    sync.Mutex // guards wbuf, fr's writes, nextID
	wbuf   []byte     // frames the writer has yet to send
	nextID uint32
	wake   chan struct{} // tells the writer that wbuf holds frames
	closed chan struct{}

	mu      sync.Mutex // guards streams, sendWin, err
	cond    *sync.Cond // signalled when sendWin grows or err is set
	streams map[uint32]*h2Call
	sendWin int64 // connection-level window of the server, for our DATA
	err     error
}

// h2Call is one call in flight; a worker reuses its own.
type h2Call struct {
	done   chan struct{} // receives one value when the call ends
	resp   []byte        // the reply's DATA, gRPC framing included
	status int           // grpc-status; -1 until the trailers arrive
	msg    string        // grpc-message
	err    error
	req    []byte // the request's gRPC frame, reused
}

func newH2Call() *h2Call { return &h2Call{done: make(chan struct{}, 1)} }

// The windows this client grants the server: large, so that replies never
// wait for a WINDOW_UPDATE of ours.
const (
	h2RecvWindow     = 1 << 30
	h2RecvWindowLow  = 1 << 29
	h2InitialSendWin = 65535 // RFC 9113's initial window, until the server says more
)

// dialH2 opens a connection to addr for calls of path.
func dialH2(ctx context.Context, addr, path string) (*h2Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &h2Conn{nc: nc, streams: map[uint32]*h2Call{}, nextID: 1, sendWin: h2InitialSendWin,
		wake: make(chan struct{}, 1), closed: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	c.fr = http2.NewFramer((*h2Buffer)(c), bufio.NewReaderSize(nc, 32<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 1 << 20

	// Every request has the same headers: once the first block has put
	// them in the table, the second (all references to the table) stays
	// valid for every later request, as with any HPACK encoder.
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := range 2 {
		for _, f := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", addr},
			{"content-type", "application/grpc"}, {"te", "trailers"}, {"user-agent", "sluice-load"},
		} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if i == 0 {
			c.first = bytes.Clone(hb.Bytes())
			hb.Reset()
		}
	}
	c.header = hb.Bytes()

	c.wbuf = append(c.wbuf, http2.ClientPreface...)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2RecvWindow})
	c.fr.WriteWindowUpdate(0, h2RecvWindow-65535)
	go c.writeLoop()
	c.wake <- struct{}{}
	go c.readLoop()
	return c, nil
}

// h2Buffer is the Framer's writer: it appends each frame to wbuf, under
// wmu.
type h2Buffer h2Conn

func (b *h2Buffer) Write(p []byte) (int, error) {
	b.wbuf = append(b.wbuf, p...)
	return len(p), nil
}

// writeLoop sends what wbuf holds each time it is woken: the frames that
// calls added while the previous write was under way go out in one write.
func (c *h2Conn) writeLoop() {
	var spare []byte
	for {
		select {
		case <-c.closed:
			return
		case <-c.wake:
		}
		// Let the calls that are ready to send add their frames first.
		runtime.Gosched()
		c.wmu.Lock()
		if len(c.wbuf) == 0 {
			c.wmu.Unlock()
			continue
		}
		// Swap buffers: calls append to spare while buf is written.
		buf := c.wbuf
		c.wbuf = spare[:0]
		c.wmu.Unlock()
		if _, err := c.nc.Write(buf); err != nil {
			c.fail(fmt.Errorf("http2: %w", err))
			return
		}
		spare = buf
	}
}

// flush wakes the writer; call it after adding frames to wbuf.
func (c *h2Conn) flush() {
	select {
	case c.wake <- struct{}{}:
	default: // the writer is awake already and will see the frames
	}
}

// Close closes the connection; calls in flight fail.
func (c *h2Conn) Close() error {
	c.fail(errors.New("connection closed"))
	c.mu.Lock()
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	c.mu.Unlock()
	return c.nc.Close()
}

// fail ends every call in flight with err and refuses new ones.
func (c *h2Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	for id, call := range c.streams {
		delete(c.streams, id)
		call.err = c.err
		call.done <- struct{}{}
	}
	c.cond.Broadcast()
	c.mu.Unlock()
}

// call sends msg as one unary call and waits for the reply; it returns the
// reply's field 1 as a varint (0 when absent).
func (c *h2Conn) call(ctx context.Context, call *h2Call, msg proto.Message) (uint64, error) {
	req, err := proto.MarshalOptions{}.MarshalAppend(append(call.req[:0], 0, 0, 0, 0, 0), msg)
	if err != nil {
		return 0, err
	}
	binary.BigEndian.PutUint32(req[1:5], uint32(len(req)-5))
	call.req = req
	call.resp, call.status, call.msg, call.err = call.resp[:0], -1, "", nil

	// Take the connection's window for the request's DATA.
	c.mu.Lock()
	for c.err == nil && c.sendWin < int64(len(req)) {
		c.cond.Wait()
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	c.sendWin -= int64(len(req))
	c.mu.Unlock()

	// Queue the HEADERS and DATA frames for the writer.
	c.wmu.Lock()
	id := c.nextID
	c.nextID += 2
	if id > 1<<31-1 {
		c.wmu.Unlock()
		return 0, errors.New("http2: stream ids exhausted")
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		c.wmu.Unlock()
		return 0, err
	}
	c.streams[id] = call
	c.mu.Unlock()
	block := c.header
	if id == 1 {
		block = c.first
	}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true})
	c.fr.WriteData(id, true, req)
	c.wmu.Unlock()
	c.flush()

	select {
	case <-call.done:
	case <-ctx.Done():
		c.mu.Lock()
		_, pending := c.streams[id]
		delete(c.streams, id)
		c.mu.Unlock()
		if !pending {
			<-call.done // the reply came at the same instant
			break
		}
		c.write(func() { c.fr.WriteRSTStream(id, http2.ErrCodeCancel) })
		return 0, ctx.Err()
	}
	if call.err != nil {
		return 0, call.err
	}
	if call.status != 0 {
		return 0, fmt.Errorf("rpc error: code = %d desc = %s", call.status, call.msg)
	}
	return field1(call.resp)
}

// field1 reads the varint field 1 of the first gRPC message in b.
func field1(b []byte) (uint64, error) {
	if len(b) < 5 || b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
		return 0, fmt.Errorf("http2: malformed gRPC reply of %d bytes", len(b))
	}
	b = b[5:]
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			return v, nil
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return 0, nil
}

// readLoop reads frames until the connection fails.
func (c *h2Conn) readLoop() {
	var unacked int64 // DATA bytes received since the last WINDOW_UPDATE
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.fail(fmt.Errorf("http2: %w", err))
			return
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			end := f.StreamEnded()
			c.mu.Lock()
			call := c.streams[f.StreamID]
			if call != nil && end {
				delete(c.streams, f.StreamID)
			}
			c.mu.Unlock()
			if call == nil {
				continue
			}
			for _, hf := range f.Fields {
				switch hf.Name {
				case ":status":
					if hf.Value != "200" {
						call.err = fmt.Errorf("http2: status %s", hf.Value)
					}
				case "grpc-status":
					call.status, _ = strconv.Atoi(hf.Value)
				case "grpc-message":
					call.msg = hf.Value
				}
			}
			if end {
				if call.err == nil && call.status < 0 {
					call.err = errors.New("http2: reply without grpc-status")
				}
				call.done <- struct{}{}
			}
		case *http2.DataFrame:
			if f.Length > 0 {
				if unacked += int64(f.Length); unacked >= h2RecvWindowLow {
					c.write(func() { c.fr.WriteWindowUpdate(0, uint32(unacked)) })
					unacked = 0
				}
			}
			c.mu.Lock()
			call := c.streams[f.StreamID]
			c.mu.Unlock()
			if call != nil {
				call.resp = append(call.resp, f.Data()...)
			}
			if f.StreamEnded() && call != nil {
				c.mu.Lock()
				delete(c.streams, f.StreamID)
				c.mu.Unlock()
				call.err = errors.New("http2: reply without trailers")
				call.done <- struct{}{}
			}
		case *http2.RSTStreamFrame:
			c.mu.Lock()
			call := c.streams[f.StreamID]
			delete(c.streams, f.StreamID)
			c.mu.Unlock()
			if call != nil {
				call.err = fmt.Errorf("http2: stream reset: %v", f.ErrCode)
				call.done <- struct{}{}
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.write(func() { c.fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				data := f.Data
				c.write(func() { c.fr.WritePing(true, data) })
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.mu.Lock()
				c.sendWin += int64(f.Increment)
				c.cond.Broadcast()
				c.mu.Unlock()
			}
		case *http2.GoAwayFrame:
			// Calls the server has taken finish; later ones fail, and
			// no new call starts.
			err := fmt.Errorf("http2: server sent GOAWAY (%v)", f.ErrCode)
			c.mu.Lock()
			if c.err == nil {
				c.err = err
			}
			for id, call := range c.streams {
				if id > f.LastStreamID {
					delete(c.streams, id)
					call.err = err
					call.done <- struct{}{}
				}
			}
			c.cond.Broadcast()
			c.mu.Unlock()
		}
	}
}

// write runs fn, which writes a frame, under the write lock and wakes the
// writer.
func (c *h2Conn) write(fn func()) {
	c.wmu.Lock()
	fn()
	c.wmu.Unlock()
	c.flush()
}

// The methods the h2 caller calls.
const (
	pathShouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	pathCheckRateLimit  = "/sluice.v1.RateLimiter/CheckRateLimit"
	pathBatchCheck      = "/sluice.v1.RateLimiter/BatchCheck"
)

// h2Caller sends the gRPC and Envoy targets' calls over h2Conns.
type h2Caller struct {
	r     *run
	conns []*h2Conn
	next  atomic.Uint32
}

func newH2Caller(cfg *Config, r *run) (caller, func(), error) {
	path := pathCheckRateLimit
	switch {
	case cfg.Target == TargetEnvoy:
		path = pathShouldRateLimit
	case cfg.Batch > 1:
		path = pathBatchCheck
	}
	h := &h2Caller{r: r}
	closeAll := func() {
		for _, c := range h.conns {
			c.Close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range cfg.Conns {
		c, err := dialH2(ctx, cfg.Addr, path)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("loadgen: %w", err)
		}
		h.conns = append(h.conns, c)
	}
	return h, closeAll, nil
}

func (h *h2Caller) call(ctx context.Context, w *worker, key int, cost int64) (bool, error) {
	cfg := &h.r.cfg
	c := h.conns[int(h.next.Add(1))%len(h.conns)]
	if w.h2 == nil {
		w.h2 = newH2Call()
	}
	var msg proto.Message
	switch {
	case cfg.Target == TargetEnvoy:
		msg = w.envoyRequest(cfg, h.r.keyNames[key], cost)
	case cfg.Batch > 1:
		msg = w.batchRequest(cfg, h.r.keyNames[key], cost)
	default:
		msg = w.checkRequest(cfg, h.r.keyNames[key], cost)
	}
	v, err := c.call(ctx, w.h2, msg)
	if err != nil {
		return false, err
	}
	if cfg.Target != TargetEnvoy {
		return v == 1, nil // allowed
	}
	return envoyVerdict(rlsv3.RateLimitResponse_Code(v))
}
