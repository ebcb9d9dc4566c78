package grpcutil

import (
	"bytes"
	"context"
	"crypto/rand"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// A request that does not decode is the caller's mistake (a message nested
// deeper than protobuf's recursion limit, or bytes that are not protobuf),
// but grpc-go answers a codec's error with Internal before any interceptor
// runs, so nothing logs it either. The servers' codec therefore lets such a
// message through empty, marked as undecodable, and the innermost
// interceptor (checkDecoded) answers it with InvalidArgument, where the
// logging interceptor sees it; the handler never does.

// undecodableField is the field number of the mark: the largest protobuf
// allows, in the message's unknown fields, which no generated code reads.
const undecodableField protowire.Number = protowire.MaxValidNumber

// markNonce makes the mark this process's own: a client cannot forge it.
var markNonce = func() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return b
}()

// serverCodec is the proto codec with undecodable messages marked instead
// of failed.
type serverCodec struct{ base encoding.CodecV2 }

func newServerCodec() serverCodec {
	return serverCodec{base: encoding.GetCodecV2(protoenc.Name)}
}

func (c serverCodec) Name() string { return c.base.Name() }

func (c serverCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

func (c serverCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	proto.Reset(m)
	mark := protowire.AppendTag(nil, undecodableField, protowire.BytesType)
	mark = protowire.AppendBytes(mark, append(append([]byte{}, markNonce...), err.Error()...))
	m.ProtoReflect().SetUnknown(mark)
	return nil
}

// undecodable returns the InvalidArgument of a request the codec marked,
// nil for any other.
func undecodable(req any) error {
	m, ok := req.(proto.Message)
	if !ok {
		return nil
	}
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		if num == undecodableField && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n >= 0 && bytes.HasPrefix(v, markNonce) {
				return status.Errorf(codes.InvalidArgument, "the request does not decode: %s", v[len(markNonce):])
			}
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil
		}
		b = b[n:]
	}
	return nil
}

// checkDecoded answers a request the codec could not decode with
// InvalidArgument, before its handler (unary calls, and each message a
// stream receives).
func checkDecoded() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := undecodable(req); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, decodedStream{ss})
	}
	return unary, stream
}

type decodedStream struct{ grpc.ServerStream }

func (s decodedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return undecodable(m)
}
