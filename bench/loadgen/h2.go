package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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
	// settled is closed when the server's first SETTINGS have been read,
	// or the connection failed before them.
	settled chan struct{}

	mu      sync.Mutex // guards streams, sendWin, the server's settings, err
	cond    *sync.Cond // signalled when sendWin grows or err is set
	streams map[uint32]*h2Call
	sendWin int64 // connection-level window of the server, for our DATA
	peakWin int64 // the largest sendWin so far
	// The server's SETTINGS_INITIAL_WINDOW_SIZE, each new stream's window
	// for our DATA, and SETTINGS_MAX_FRAME_SIZE.
	streamWin int64
	maxFrame  int
	// The server's SETTINGS_MAX_CONCURRENT_STREAMS; 0 when it sets none.
	maxStreams uint32
	err        error
	stopped    bool // the run is over: no new call starts (h2Caller.loop)
}

// h2Call is one call in flight; a worker reuses its own.
type h2Call struct {
	done   chan struct{} // receives one value when the call ends (no then)
	resp   []byte        // the reply's DATA, gRPC framing included
	status int           // grpc-status; -1 until the trailers arrive
	msg    string        // grpc-message
	err    error
	req    []byte // the request's gRPC frame, reused

	// then, when set, is called instead of sending on done, by the
	// goroutine that ended the call (h2Caller.loop).
	then     func(*h2Call)
	deadline time.Time
	// The request, for then.
	w    *worker
	conn *h2Conn
	key  int
	cost int64
	due  time.Time
}

func newH2Call() *h2Call { return &h2Call{done: make(chan struct{}, 1)} }

// The windows this client grants the server: large, so that replies never
// wait for a WINDOW_UPDATE of ours.
const (
	h2RecvWindow     = 1 << 30
	h2RecvWindowLow  = 1 << 29
	h2InitialSendWin = 65535 // RFC 9113's initial window, until the server says more
	h2MinMaxFrame    = 16384 // RFC 9113's SETTINGS_MAX_FRAME_SIZE, until the server says more
)

// dialH2 opens a connection to addr for calls of path, over TLS with tc
// when it is not nil (offering HTTP/2 alone), and returns once it has read
// the server's SETTINGS (the first frame a server sends), so that every
// request is sent under them.
func dialH2(ctx context.Context, addr, path string, tc *tls.Config) (*h2Conn, error) {
	scheme := "http"
	var nc net.Conn
	var err error
	if tc != nil {
		scheme = "https"
		tc = tc.Clone()
		tc.NextProtos = []string{http2.NextProtoTLS}
		d := tls.Dialer{Config: tc}
		if nc, err = d.DialContext(ctx, "tcp", addr); err != nil {
			return nil, err
		}
		if p := nc.(*tls.Conn).ConnectionState().NegotiatedProtocol; p != http2.NextProtoTLS {
			nc.Close()
			return nil, fmt.Errorf("http2: the server chose protocol %q over TLS, not h2", p)
		}
	} else {
		var d net.Dialer
		if nc, err = d.DialContext(ctx, "tcp", addr); err != nil {
			return nil, err
		}
	}
	c := &h2Conn{nc: nc, streams: map[uint32]*h2Call{}, nextID: 1, sendWin: h2InitialSendWin, peakWin: h2InitialSendWin,
		streamWin: h2InitialSendWin, maxFrame: h2MinMaxFrame,
		wake: make(chan struct{}, 1), closed: make(chan struct{}), settled: make(chan struct{})}
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
			{":method", "POST"}, {":scheme", scheme}, {":path", path}, {":authority", addr},
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
	select {
	case <-c.settled:
	case <-ctx.Done():
		c.Close()
		return nil, fmt.Errorf("http2: no SETTINGS from the server: %w", ctx.Err())
	}
	c.mu.Lock()
	err = c.err
	c.mu.Unlock()
	if err != nil {
		c.Close()
		return nil, err
	}
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
	err = c.err
	ended := c.take(func(uint32, *h2Call) bool { return true })
	c.cond.Broadcast()
	c.mu.Unlock()
	for _, call := range ended {
		call.err = err
		complete(call)
	}
}

// take removes from streams the calls keep selects and returns them; c.mu
// is held. Whoever removes a call from streams ends it.
func (c *h2Conn) take(keep func(uint32, *h2Call) bool) []*h2Call {
	var ended []*h2Call
	for id, call := range c.streams {
		if keep(id, call) {
			delete(c.streams, id)
			ended = append(ended, call)
		}
	}
	return ended
}

// complete hands an ended call to its caller.
func complete(call *h2Call) {
	if call.then != nil {
		call.then(call)
		return
	}
	call.done <- struct{}{}
}

// errStopped refuses the calls of a run that is over.
var errStopped = errors.New("http2: the run is over")

// call sends msg as one unary call and waits for the reply; it returns the
// reply's field 1 as a varint (0 when absent).
func (c *h2Conn) call(ctx context.Context, call *h2Call, msg proto.Message) (uint64, error) {
	if err := call.marshal(msg); err != nil {
		return 0, err
	}
	id, err := c.send(ctx, call, true)
	if err != nil {
		return 0, err
	}
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
	return call.result()
}

// marshal makes msg call's request and readies call for its reply.
func (call *h2Call) marshal(msg proto.Message) error {
	req, err := proto.MarshalOptions{}.MarshalAppend(append(call.req[:0], 0, 0, 0, 0, 0), msg)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(req[1:5], uint32(len(req)-5))
	call.req = req
	call.resp, call.status, call.msg, call.err = call.resp[:0], -1, "", nil
	return nil
}

// result returns the field 1 of call's reply, or why it has none.
func (call *h2Call) result() (uint64, error) {
	if call.err != nil {
		return 0, call.err
	}
	if call.status != 0 {
		return 0, fmt.Errorf("rpc error: code = %d desc = %s", call.status, call.msg)
	}
	return field1(call.resp)
}

// send queues call's request (marshalled) for the writer and returns its
// stream id. When the server's window is too small for it, send waits
// for a WINDOW_UPDATE if wait is set, until ctx ends (then it returns
// ctx.Err()), and fails with errWindow otherwise.
func (c *h2Conn) send(ctx context.Context, call *h2Call, wait bool) (uint32, error) {
	req := call.req
	// Take the connection's window for the request's DATA.
	c.mu.Lock()
	if int64(len(req)) > c.streamWin {
		// A stream's window cannot grow before its first DATA.
		err := fmt.Errorf("http2: request of %d bytes is larger than the server's stream window of %d bytes", len(req), c.streamWin)
		c.mu.Unlock()
		return 0, err
	}
	if wait && c.sendWin < int64(len(req)) {
		// Rare: only a waiting request pays for the wake-up at ctx's end.
		stop := context.AfterFunc(ctx, func() {
			c.mu.Lock()
			c.cond.Broadcast()
			c.mu.Unlock()
		})
		for c.err == nil && !(c.stopped && call.then != nil) && ctx.Err() == nil && c.sendWin < int64(len(req)) {
			c.cond.Wait()
		}
		stop()
	}
	switch {
	case c.err != nil:
		err := c.err
		c.mu.Unlock()
		return 0, err
	case c.stopped && call.then != nil:
		c.mu.Unlock()
		return 0, errStopped
	case c.sendWin < int64(len(req)):
		err := errWindow
		switch {
		case wait && len(c.streams) == 0 && int64(len(req)) > c.peakWin:
			// Larger than the server ever let us send at once, and
			// nothing in flight to earn more: it never will fit.
			err = fmt.Errorf("http2: request of %d bytes is larger than the server's connection window of %d bytes", len(req), c.peakWin)
		case wait:
			err = ctx.Err()
		}
		c.mu.Unlock()
		return 0, err
	}
	c.sendWin -= int64(len(req))
	frame := c.maxFrame
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
	err := c.err
	if err == nil && c.stopped && call.then != nil {
		err = errStopped
	}
	if err != nil {
		c.sendWin += int64(len(req))
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
	for len(req) > frame {
		c.fr.WriteData(id, false, req[:frame])
		req = req[frame:]
	}
	c.fr.WriteData(id, true, req)
	c.wmu.Unlock()
	c.flush()
	return id, nil
}

// errWindow is send's error when the server's window is too small and
// send may not wait.
var errWindow = errors.New("http2: the server's flow-control window is full")

// write runs fn, which writes a frame, under the write lock and wakes the
// writer.
func (c *h2Conn) write(fn func()) {
	c.wmu.Lock()
	fn()
	c.wmu.Unlock()
	c.flush()
}

// sweep ends, with context.DeadlineExceeded, the calls on c that outlive
// timeout, until stop is closed.
func (c *h2Conn) sweep(timeout time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(min(max(timeout/8, time.Millisecond), 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			c.mu.Lock()
			ended := c.take(func(_ uint32, call *h2Call) bool { return now.After(call.deadline) })
			c.mu.Unlock()
			for _, call := range ended {
				// The stream's id is not kept; the server's answer, if
				// it comes, finds no call and is dropped.
				call.err = context.DeadlineExceeded
				complete(call)
			}
		}
	}
}
