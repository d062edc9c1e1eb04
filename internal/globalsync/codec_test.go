package globalsync

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func testMessage(n int) *Message {
	m := &Message{Origin: "eu-west", Instance: "i-0a1b", SentAt: 1_790_000_000_123, Seq: 42}
	for i := range n {
		m.Entries = append(m.Entries, Entry{
			Window: Window{Key: fmt.Sprintf("tenant:%d:/v1/orders", i), Start: 1_790_000_000_000 - int64(i%3)*60_000, Length: time.Minute},
			Count:  int64(i * 7),
		})
	}
	return m
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, n := range []int{1, 2, 10, 200, 3000} {
		m := testMessage(n)
		b, err := AppendEncode(nil, m)
		if err != nil {
			t.Fatalf("%d entries: encode: %v", n, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("%d entries: decode: %v", n, err)
		}
		if !reflect.DeepEqual(&got, m) {
			t.Fatalf("%d entries: decoded %+v, want %+v", n, got, *m)
		}
	}
}

func TestEncodeCompressesOnlyWhenItPays(t *testing.T) {
	small, err := AppendEncode(nil, testMessage(1))
	if err != nil {
		t.Fatal(err)
	}
	if small[3]&flagDeflate != 0 {
		t.Errorf("one entry: compressed, want plain")
	}
	big, err := AppendEncode(nil, testMessage(200))
	if err != nil {
		t.Fatal(err)
	}
	if big[3]&flagDeflate == 0 {
		t.Errorf("200 entries of similar keys: plain, want compressed")
	}
	// Random keys do not compress: the body stays plain.
	m := testMessage(0)
	seed := uint64(1)
	for range 100 {
		var key [24]byte
		for j := range key {
			seed = seed*6364136223846793005 + 1442695040888963407
			key[j] = byte(seed >> 56)
		}
		m.Entries = append(m.Entries, Entry{Window: Window{Key: string(key[:]), Start: 60_000, Length: time.Minute}, Count: int64(seed >> 40)})
	}
	rnd, err := AppendEncode(nil, m)
	if err != nil {
		t.Fatal(err)
	}
	if rnd[3]&flagDeflate != 0 {
		t.Errorf("random keys: compressed, want plain")
	}
	t.Logf("200 entries: %d bytes; 100 random keys: %d bytes", len(big), len(rnd))
}

func TestEncodeRejectsWhatDecodeWould(t *testing.T) {
	ok := Entry{Window: Window{Key: "k", Start: 0, Length: time.Second}, Count: 1}
	long := Entry{Window: Window{Key: strings.Repeat("k", MaxKeyLen+1), Length: time.Second}}
	for name, m := range map[string]*Message{
		"no origin":       {Entries: []Entry{ok}},
		"long origin":     {Origin: strings.Repeat("r", MaxNameLen+1), Entries: []Entry{ok}},
		"long key":        {Origin: "r", Entries: []Entry{long}},
		"negative start":  {Origin: "r", Entries: []Entry{{Window: Window{Key: "k", Start: -1, Length: time.Second}}}},
		"zero length":     {Origin: "r", Entries: []Entry{{Window: Window{Key: "k"}}}},
		"sub-ms length":   {Origin: "r", Entries: []Entry{{Window: Window{Key: "k", Length: 1500 * time.Microsecond}}}},
		"negative count":  {Origin: "r", Entries: []Entry{{Window: ok.Window, Count: -1}}},
		"negative sentAt": {Origin: "r", SentAt: -1, Entries: []Entry{ok}},
	} {
		if b, err := AppendEncode([]byte("x"), m); err == nil || string(b) != "x" {
			t.Errorf("%s: encode = %q, %v; want the input and an error", name, b, err)
		}
	}
}

// A heartbeat is a message without entries.
func TestHeartbeatRoundTrip(t *testing.T) {
	b, err := AppendEncode(nil, &Message{Origin: "r", Instance: "i", SentAt: 5, Seq: 2})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(b)
	if err != nil || m.Origin != "r" || m.Seq != 2 || len(m.Entries) != 0 {
		t.Errorf("Decode = %+v, %v", m, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	good, err := AppendEncode(nil, testMessage(3))
	if err != nil {
		t.Fatal(err)
	}
	compressed, err := AppendEncode(nil, testMessage(300))
	if err != nil {
		t.Fatal(err)
	}
	with := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	// A bomb: a small DEFLATE body that inflates past the limit.
	bomb := append([]byte{magic0, magic1, wireVersion, flagDeflate}, mustDeflate(t, make([]byte, MaxMessageSize+10))...)
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"magic only", []byte{magic0, magic1}, ErrTruncated},
		{"JSON", []byte(`{"count":1}`), ErrForeign},
		{"other magic", with(0, 'X'), ErrForeign},
		{"next version", with(2, wireVersion+1), ErrForeign},
		{"unknown flag", with(3, 0x80), ErrMalformed},
		{"truncated", good[:len(good)-1], ErrTruncated},
		{"truncated compressed", compressed[:len(compressed)/2], ErrTruncated},
		{"trailing byte", append(bytes.Clone(good), 0), ErrMalformed},
		{"oversized", make([]byte, MaxMessageSize+1), ErrOversized},
		{"bomb", bomb, ErrOversized},
		{"too many entries", append([]byte{magic0, magic1, wireVersion, 0, 1, 'r', 0, 0, 0, 0xff, 0xff, 0x03}, make([]byte, 40)...), ErrMalformed},
		{"no origin", []byte{magic0, magic1, wireVersion, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1}, ErrMalformed},
		{"zero length", []byte{magic0, magic1, wireVersion, 0, 1, 'r', 0, 0, 0, 1, 0, 0, 0, 1}, ErrMalformed},
		{"negative start", []byte{magic0, magic1, wireVersion, 0, 1, 'r', 0, 0, 0, 1, 0, 1, 1, 1}, ErrMalformed},
		{"varint overflow", append([]byte{magic0, magic1, wireVersion, 0, 1, 'r', 0}, bytes.Repeat([]byte{0xff}, 11)...), ErrMalformed},
		{"count beyond int64", append([]byte{magic0, magic1, wireVersion, 0, 1, 'r', 0, 0, 0, 1, 0, 0, 1}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), ErrMalformed},
	} {
		_, err := Decode(tc.b)
		if !errors.Is(err, tc.want) || !errors.Is(err, ErrDecode) {
			t.Errorf("%s: Decode error %v, want %v", tc.name, err, tc.want)
		}
	}
}

func mustDeflate(t testing.TB, b []byte) []byte {
	z, ok := deflate(b)
	if !ok {
		t.Fatal("zeros did not compress")
	}
	return z
}

// FuzzDecode checks that Decode never panics, and that whatever it
// accepts encodes again to a message that decodes to the same.
func FuzzDecode(f *testing.F) {
	for _, n := range []int{1, 5, 300} {
		b, err := AppendEncode(nil, testMessage(n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{magic0, magic1, wireVersion, 0, 1, 'r', 0, 0, 0, 1, 0, 0, 1, 1})
	f.Add([]byte("not ours"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("Decode error %v does not wrap ErrDecode", err)
			}
			return
		}
		again, err := AppendEncode(nil, &m)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		m2, err := Decode(again)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip: got %+v, want %+v", m2, m)
		}
	})
}

func BenchmarkEncode200(b *testing.B) {
	m := testMessage(200)
	var buf []byte
	for b.Loop() {
		var err error
		if buf, err = AppendEncode(buf[:0], m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(buf)), "bytes/msg")
}

func BenchmarkDecode200(b *testing.B) {
	buf, err := AppendEncode(nil, testMessage(200))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}
