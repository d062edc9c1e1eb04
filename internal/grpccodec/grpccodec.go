// Package grpccodec is the gRPC server codec of Sluice's gRPC address:
// protobuf, with one difference. grpc-go answers a request that its codec
// cannot decode with code Internal, and protobuf refuses proto3 string
// fields holding invalid UTF-8; so a client that sends invalid UTF-8 (the
// Go runtime will not, others can) would get Internal instead of the
// InvalidArgument naming the field that Sluice answers for every other bad
// input. This codec decodes such a request with the bad bytes replaced by
// U+FFFD and marks it with the path of the first bad field, in an unknown
// field of the request; the services call InvalidUTF8 first and refuse a
// marked request.
//
// Likewise, a request of Sluice's or Envoy's rate limit services that is
// not well-formed protobuf (truncated, a bad tag) would get Internal: the
// codec decodes it as an empty request marked with the decoding error,
// which the services refuse with InvalidArgument (see Malformed). Requests
// of other services (health, reflection) keep grpc-go's answer.
package grpccodec

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// markField is the field number of the mark: the largest field number,
// which none of the services' messages uses; malformedField that of the
// mark of a malformed request.
const (
	markField      = protowire.MaxValidNumber
	malformedField = protowire.MaxValidNumber - 1
)

// Codec is the codec; its zero value is ready to use and it is safe for
// concurrent use. Install it with grpc.ForceServerCodecV2(grpccodec.Codec{}).
type Codec struct{}

// Name implements encoding.CodecV2: it replaces the "proto" codec.
func (Codec) Name() string { return protoenc.Name }

// Marshal implements encoding.CodecV2 with the proto codec.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(protoenc.Name).Marshal(v)
}

// Unmarshal implements encoding.CodecV2: the proto codec's, except for
// invalid UTF-8 in string fields (see the package doc).
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := encoding.GetCodecV2(protoenc.Name).Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	raw := data.Materialize()
	fixed, path, ok := repair(raw, m.ProtoReflect().Descriptor(), "")
	if !ok || path == "" {
		return malformed(m, err)
	}
	fixed = protowire.AppendTag(fixed, markField, protowire.BytesType)
	fixed = protowire.AppendString(fixed, path)
	if proto.Unmarshal(fixed, m) != nil {
		return err
	}
	return nil
}

// malformed marks m, a request that could not be decoded with err, as
// such, when it belongs to one of the rate limit services; otherwise it
// returns err.
func malformed(m proto.Message, err error) error {
	name := string(m.ProtoReflect().Descriptor().FullName())
	if !strings.HasPrefix(name, "sluice.") && !strings.HasPrefix(name, "envoy.service.ratelimit.") {
		return err
	}
	proto.Reset(m)
	var b []byte
	b = protowire.AppendTag(b, malformedField, protowire.BytesType)
	b = protowire.AppendString(b, err.Error())
	m.ProtoReflect().SetUnknown(b)
	return nil
}

// Malformed returns the decoding error of a request that was not
// well-formed protobuf, and true, when the codec marked m so; otherwise
// "" and false. The request is otherwise empty.
func Malformed(m proto.Message) (reason string, ok bool) {
	return mark(m, malformedField)
}

// InvalidUTF8 returns the path of the first string field of m that held
// invalid UTF-8, such as "checks[1].user", and true, when the codec marked
// m; otherwise "" and false.
func InvalidUTF8(m proto.Message) (field string, ok bool) {
	return mark(m, markField)
}

// mark returns the value of the mark field of m, if any.
func mark(m proto.Message, field protowire.Number) (string, bool) {
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
		if num == field && typ == protowire.BytesType {
			v, n := protowire.ConsumeString(b)
			return v, n >= 0
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return "", false
		}
		b = b[n:]
	}
	return "", false
}

// repair returns the message b of type md with invalid UTF-8 in string
// fields (nested messages included) replaced by U+FFFD, and the path of
// the first such field ("" when none); ok is false when b is not
// well-formed.
func repair(b []byte, md protoreflect.MessageDescriptor, prefix string) (out []byte, path string, ok bool) {
	out = make([]byte, 0, len(b))
	counts := map[protowire.Number]int{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, "", false
		}
		tag := b[:n]
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil || (fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.MessageKind) {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, "", false
			}
			out = append(append(out, tag...), b[:n]...)
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, "", false
		}
		b = b[n:]
		name := prefix + string(fd.Name())
		if fd.IsList() {
			name += "[" + strconv.Itoa(counts[num]) + "]"
			counts[num]++
		}
		switch {
		case fd.Kind() == protoreflect.MessageKind:
			fixed, p, ok := repair(v, fd.Message(), name+".")
			if !ok {
				return nil, "", false
			}
			if path == "" {
				path = p
			}
			v = fixed
		case !utf8.Valid(v):
			if path == "" {
				path = name
			}
			v = []byte(strings.ToValidUTF8(string(v), "\uFFFD"))
		}
		out = append(out, tag...)
		out = protowire.AppendBytes(out, v)
	}
	return out, path, true
}
