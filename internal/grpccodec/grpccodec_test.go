package grpccodec

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

func str(b []byte, num protowire.Number, v string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
}

func TestUnmarshal(t *testing.T) {
	tests := []struct {
		name  string
		raw   []byte
		field string // "" when the message is valid
	}{
		{"valid", str(str(nil, 1, "c"), 7, "u"), ""},
		{"top level", str(str(nil, 1, "c\xff"), 2, "/a"), "client_id"},
		{"first of two", str(str(nil, 7, "\xc3"), 8, "\xff"), "user"},
		{"nested, second item", str(str(str(nil, 1, "c"), 7, string(str(nil, 2, "/a"))), 7, string(str(nil, 2, "/\xfe"))), "checks[1].resource"},
		{"unknown fields kept", append(str(nil, 1, "c"), protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5)...), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m proto.Message = &sluicev1.CheckRequest{}
			if tt.name == "nested, second item" {
				m = &sluicev1.BatchCheckRequest{}
			}
			if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(tt.raw)}, m); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			field, ok := InvalidUTF8(m)
			if field != tt.field || ok != (tt.field != "") {
				t.Errorf("InvalidUTF8 = %q, %v; want %q", field, ok, tt.field)
			}
		})
	}
}

// TestUnmarshalMalformed checks that a request of the rate limit
// services that is not well-formed protobuf is decoded empty and marked
// (the services answer InvalidArgument), and that other messages keep
// the error (grpc-go's Internal).
func TestUnmarshalMalformed(t *testing.T) {
	raw := []byte{0x0a, 0x05, 'a'} // client_id claims 5 bytes, has 1
	m := &sluicev1.CheckRequest{}
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, m); err != nil {
		t.Fatalf("Unmarshal of a truncated request: %v", err)
	}
	if reason, ok := Malformed(m); !ok || reason == "" || m.GetClientId() != "" {
		t.Errorf("Malformed = %q, %v; client_id %q: want a reason, marked, empty", reason, ok, m.GetClientId())
	}
	if _, ok := InvalidUTF8(m); ok {
		t.Error("a malformed request marked as invalid UTF-8")
	}
	if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &durationpb.Duration{}); err == nil {
		t.Error("Unmarshal of a truncated message of another package: nil error")
	}
}

// FuzzUnmarshal checks that the codec never panics, decodes exactly as
// protobuf whatever protobuf accepts, and marks only what it repaired.
func FuzzUnmarshal(f *testing.F) {
	f.Add(str(str(nil, 1, "c"), 7, "u"))
	f.Add(str(str(nil, 1, "c\xff"), 2, "/a"))
	f.Add(str(nil, 7, string(str(nil, 7, "\xfe"))))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want sluicev1.BatchCheckRequest
		wantErr := proto.Unmarshal(raw, &want)
		var got sluicev1.BatchCheckRequest
		err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, &got)
		_, marked := InvalidUTF8(&got)
		if _, bad := Malformed(&got); bad {
			marked = true
		}
		switch {
		case wantErr == nil && err != nil:
			t.Fatalf("protobuf accepts %q, the codec refuses it: %v", raw, err)
		case wantErr == nil && !proto.Equal(&got, &want):
			t.Fatalf("decoded %v, protobuf %v", &got, &want)
		case wantErr != nil && err == nil && !marked:
			t.Fatalf("protobuf refuses %q (%v), the codec accepts it unmarked", raw, wantErr)
		}
	})
}
