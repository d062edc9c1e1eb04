package globalsync

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"
)

// The wire format of one message, version 1. Every integer is a varint
// (encoding/binary's Uvarint, or Varint where it says signed):
//
//	magic    2 bytes  0x53 0x59 ("SY"): anything else is not ours
//	version  1 byte   1
//	flags    1 byte   bit 0: the body below is compressed with DEFLATE
//	body:
//	  origin    length, bytes   the region that counted
//	  instance  length, bytes   the Sluice instance that sent it
//	  sentAt    uvarint         unix ms when it was sent
//	  seq       uvarint         the sender's message sequence, from 1
//	  n         uvarint         number of entries, at least 1
//	  n entries:
//	    key     length, bytes
//	    start   varint          window start in unix ms, as the
//	                            difference from the previous entry's
//	                            start (from 0 for the first)
//	    length  uvarint         window length in ms, at least 1
//	    count   uvarint         the origin's count in that window
//
// Batches hold entries of a few window lengths, so most starts are
// equal to the previous one and cost one byte.
const (
	magic0, magic1 = 0x53, 0x59
	wireVersion    = 1
	flagDeflate    = 1 << 0
	headerSize     = 4
)

// Limits on what a message may hold. Decode rejects anything beyond them,
// so that a garbage or hostile message costs a bounded amount of memory.
const (
	// MaxMessageSize is the largest message Encode produces and Decode
	// accepts, before and after decompression, in bytes.
	MaxMessageSize = 512 << 10
	// MaxKeyLen is the longest key a message may carry, in bytes.
	MaxKeyLen = 1024
	// MaxNameLen is the longest region or instance name, in bytes.
	MaxNameLen = 64
	// MaxWindowLength is the longest window a message may carry.
	MaxWindowLength = 7 * 24 * time.Hour
	// compressAbove is the body size from which compression is tried:
	// below it DEFLATE's block overhead eats the gain.
	compressAbove = 256
	// minEntrySize is the fewest bytes one encoded entry takes: an empty
	// key's length, a start, a length and a count of one byte each.
	minEntrySize = 4
)

// Decode's errors. Each wraps ErrDecode, so a caller can count them
// together or one by one.
var (
	// ErrDecode is the error every failed Decode wraps.
	ErrDecode = errors.New("globalsync: undecodable message")
	// ErrForeign is a message that is not one of ours: wrong magic, or
	// a version this code does not read.
	ErrForeign = fmt.Errorf("%w: not a sync message of a known version", ErrDecode)
	// ErrTruncated is a message that ends in the middle of a field.
	ErrTruncated = fmt.Errorf("%w: truncated", ErrDecode)
	// ErrOversized is a message larger than MaxMessageSize, before or
	// after decompression.
	ErrOversized = fmt.Errorf("%w: larger than %d bytes", ErrDecode, MaxMessageSize)
	// ErrMalformed is a message whose fields are out of range or
	// inconsistent.
	ErrMalformed = fmt.Errorf("%w: malformed", ErrDecode)
)

// Entry is one origin's count in one window.
type Entry struct {
	Window
	Count int64
}

// Message is one batch of counts sent by one instance of one region.
type Message struct {
	Origin   string  // the region whose counts these are
	Instance string  // the sending instance, for diagnostics
	SentAt   int64   // unix ms when the batch was sent
	Seq      uint64  // the sender's message sequence, from 1
	Entries  []Entry // none in a heartbeat: the region is heard, and has nothing new
}

// AppendEncode appends m's encoding to dst and returns the extended slice.
// It compresses the body when that makes the message smaller. It fails
// when m breaks one of the limits Decode enforces, so that every message
// it produces decodes.
func AppendEncode(dst []byte, m *Message) ([]byte, error) {
	if err := m.validate(); err != nil {
		return dst, err
	}
	start := len(dst)
	dst = append(dst, magic0, magic1, wireVersion, 0)
	body := len(dst)
	dst = appendString(dst, m.Origin)
	dst = appendString(dst, m.Instance)
	dst = binary.AppendUvarint(dst, uint64(m.SentAt))
	dst = binary.AppendUvarint(dst, m.Seq)
	dst = binary.AppendUvarint(dst, uint64(len(m.Entries)))
	var prev int64
	for _, e := range m.Entries {
		dst = appendString(dst, e.Key)
		dst = binary.AppendVarint(dst, e.Start-prev) // both non-negative, so no overflow
		prev = e.Start
		dst = binary.AppendUvarint(dst, uint64(e.Length.Milliseconds()))
		dst = binary.AppendUvarint(dst, uint64(e.Count))
	}
	if len(dst)-start > MaxMessageSize {
		return dst[:start], fmt.Errorf("globalsync: message of %d entries is %d bytes, more than %d", len(m.Entries), len(dst)-start, MaxMessageSize)
	}
	if len(dst)-body >= compressAbove {
		if z, ok := deflate(dst[body:]); ok {
			dst = append(dst[:body], z...)
			dst[start+3] |= flagDeflate
		}
	}
	return dst, nil
}

// validate reports whether m is within the limits Decode enforces.
func (m *Message) validate() error {
	switch {
	case len(m.Origin) == 0 || len(m.Origin) > MaxNameLen:
		return fmt.Errorf("globalsync: origin %q: want 1 to %d bytes", m.Origin, MaxNameLen)
	case len(m.Instance) > MaxNameLen:
		return fmt.Errorf("globalsync: instance name of %d bytes, more than %d", len(m.Instance), MaxNameLen)
	case m.SentAt < 0:
		return fmt.Errorf("globalsync: negative send time %d", m.SentAt)
	}
	for _, e := range m.Entries {
		if err := e.validate(); err != nil {
			return err
		}
	}
	return nil
}

func (e *Entry) validate() error {
	switch {
	case len(e.Key) > MaxKeyLen:
		return fmt.Errorf("globalsync: key of %d bytes, more than %d", len(e.Key), MaxKeyLen)
	case e.Start < 0:
		return fmt.Errorf("globalsync: key %q: negative window start %d", e.Key, e.Start)
	case e.Length < time.Millisecond || e.Length > MaxWindowLength || e.Length%time.Millisecond != 0:
		return fmt.Errorf("globalsync: key %q: window length %v is not whole milliseconds between 1ms and %v", e.Key, e.Length, MaxWindowLength)
	case e.Count < 0:
		return fmt.Errorf("globalsync: key %q: negative count %d", e.Key, e.Count)
	}
	return nil
}

// Decode decodes one message. Its errors wrap ErrForeign, ErrTruncated,
// ErrOversized or ErrMalformed (and all of them ErrDecode). The message
// returned shares no memory with b.
func Decode(b []byte) (Message, error) {
	if len(b) > MaxMessageSize {
		return Message{}, ErrOversized
	}
	if len(b) < headerSize {
		if len(b) >= 2 && (b[0] != magic0 || b[1] != magic1) {
			return Message{}, ErrForeign
		}
		return Message{}, ErrTruncated
	}
	if b[0] != magic0 || b[1] != magic1 || b[2] != wireVersion {
		return Message{}, ErrForeign
	}
	flags, body := b[3], b[headerSize:]
	if flags&^flagDeflate != 0 {
		return Message{}, fmt.Errorf("%w: unknown flags %#x", ErrMalformed, flags)
	}
	if flags&flagDeflate != 0 {
		var err error
		if body, err = inflate(body); err != nil {
			return Message{}, err
		}
	}
	d := decoder{b: body}
	var m Message
	m.Origin = d.str(MaxNameLen)
	m.Instance = d.str(MaxNameLen)
	m.SentAt = d.int63()
	m.Seq = d.uvarint()
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b))/minEntrySize {
		d.fail(fmt.Errorf("%w: %d entries in %d bytes", ErrMalformed, n, len(d.b)))
	}
	if d.err == nil && m.Origin == "" {
		d.fail(fmt.Errorf("%w: no origin", ErrMalformed))
	}
	if d.err == nil {
		m.Entries = make([]Entry, 0, n)
	}
	var start int64
	for i := uint64(0); i < n && d.err == nil; i++ {
		var e Entry
		e.Key = d.str(MaxKeyLen)
		delta := d.varint()
		if d.err == nil {
			if delta < 0 && start < -delta || delta > 0 && start > math.MaxInt64-delta {
				d.fail(fmt.Errorf("%w: window start out of range", ErrMalformed))
				break
			}
			start += delta
		}
		e.Start = start
		ms := d.uvarint()
		e.Count = d.int63()
		if d.err != nil {
			break
		}
		if ms == 0 || ms > uint64(MaxWindowLength/time.Millisecond) {
			d.fail(fmt.Errorf("%w: window length %dms", ErrMalformed, ms))
			break
		}
		e.Length = time.Duration(ms) * time.Millisecond
		m.Entries = append(m.Entries, e)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Errorf("%w: %d bytes after the last entry", ErrMalformed, len(d.b)))
	}
	if d.err != nil {
		return Message{}, d.err
	}
	return m, nil
}

// decoder reads fields from b; after the first error every read returns
// zero and err keeps that first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	switch {
	case n == 0:
		d.fail(ErrTruncated)
		return 0
	case n < 0:
		d.fail(fmt.Errorf("%w: varint overflows 64 bits", ErrMalformed))
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	switch {
	case n == 0:
		d.fail(ErrTruncated)
		return 0
	case n < 0:
		d.fail(fmt.Errorf("%w: varint overflows 64 bits", ErrMalformed))
		return 0
	}
	d.b = d.b[n:]
	return v
}

// int63 reads a uvarint that must fit an int64.
func (d *decoder) int63() int64 {
	v := d.uvarint()
	if v > math.MaxInt64 {
		d.fail(fmt.Errorf("%w: %d out of range", ErrMalformed, v))
		return 0
	}
	return int64(v)
}

func (d *decoder) str(max int) string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(max) {
		d.fail(fmt.Errorf("%w: string of %d bytes, more than %d", ErrMalformed, n, max))
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail(ErrTruncated)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// flateWriters keeps compressors between batches: a flate.Writer holds
// several hundred kilobytes of tables.
var flateWriters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestSpeed) // the level is valid, so no error
	return w
}}

// deflate returns body compressed, and whether that is shorter than body
// by enough to pay for the decompression on every receiver.
func deflate(body []byte) ([]byte, bool) {
	var buf bytes.Buffer
	buf.Grow(len(body) / 2)
	w := flateWriters.Get().(*flate.Writer)
	defer flateWriters.Put(w)
	w.Reset(&buf)
	if _, err := w.Write(body); err != nil {
		return nil, false
	}
	if err := w.Close(); err != nil {
		return nil, false
	}
	if buf.Len() > len(body)*9/10 {
		return nil, false
	}
	return buf.Bytes(), true
}

// inflate decompresses a body, refusing to produce more than
// MaxMessageSize bytes.
func inflate(z []byte) ([]byte, error) {
	r := flate.NewReader(bytes.NewReader(z))
	defer r.Close()
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, MaxMessageSize+1))
	switch {
	case err != nil:
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: compressed body: %v", ErrTruncated, err)
		}
		return nil, fmt.Errorf("%w: compressed body: %v", ErrMalformed, err)
	case n > MaxMessageSize:
		return nil, ErrOversized
	}
	return buf.Bytes(), nil
}
