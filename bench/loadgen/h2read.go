// Reading an HTTP/2 connection: its frames and the calls they complete.

package loadgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/net/http2"
	"google.golang.org/protobuf/encoding/protowire"
)

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
	settled := false
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.fail(fmt.Errorf("http2: %w", err))
			if !settled {
				close(c.settled)
			}
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
				complete(call)
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
				_, ours := c.streams[f.StreamID] // not ended meanwhile by a sweeper
				delete(c.streams, f.StreamID)
				c.mu.Unlock()
				if ours {
					call.err = errors.New("http2: reply without trailers")
					complete(call)
				}
			}
		case *http2.RSTStreamFrame:
			c.mu.Lock()
			call := c.streams[f.StreamID]
			delete(c.streams, f.StreamID)
			c.mu.Unlock()
			if call != nil {
				call.err = fmt.Errorf("http2: stream reset: %v", f.ErrCode)
				complete(call)
			}
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			c.mu.Lock()
			err := f.ForeachSetting(func(s http2.Setting) error {
				if err := s.Valid(); err != nil {
					return err
				}
				switch s.ID {
				case http2.SettingInitialWindowSize:
					c.streamWin = int64(s.Val)
				case http2.SettingMaxFrameSize:
					c.maxFrame = int(s.Val)
				case http2.SettingMaxConcurrentStreams:
					c.maxStreams = s.Val
				}
				return nil
			})
			c.mu.Unlock()
			if err != nil {
				c.fail(fmt.Errorf("http2: server's SETTINGS: %w", err))
				c.Close()
			} else {
				c.write(func() { c.fr.WriteSettingsAck() })
			}
			if !settled {
				settled = true
				close(c.settled)
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
				c.peakWin = max(c.peakWin, c.sendWin)
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
			ended := c.take(func(id uint32, _ *h2Call) bool { return id > f.LastStreamID })
			c.cond.Broadcast()
			c.mu.Unlock()
			for _, call := range ended {
				call.err = err
				complete(call)
			}
		}
	}
}
