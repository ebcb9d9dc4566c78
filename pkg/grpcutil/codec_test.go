package grpcutil_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/volplane/volplane/pkg/grpcutil"
)

// rawCodec sends the bytes it is given as they are (a client that does not
// play by protobuf's rules).
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*(v.(*[]byte)) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

var _ encoding.CodecV2 = rawCodec{}

// deepStruct is a google.protobuf.Struct nested n levels: {"a":{"a":...}}.
func deepStruct(n int) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewNumberValue(1)}}
	for range n - 1 {
		s = &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStructValue(s)}}
	}
	return s
}

// A request that protobuf cannot decode, sent straight to a service (not
// through the gateway), fails with InvalidArgument saying why, is logged
// with its caller, and never reaches the handler: nested deeper than
// protobuf's recursion limit, or not protobuf at all, to a unary method or
// a stream.
func TestUndecodableRequestsAreInvalidArgument(t *testing.T) {
	logs := &syncBuffer{}
	srv, err := grpcutil.NewServer(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})), grpcutil.ServerOptions{TLS: grpcutil.TLSFiles{InsecurePlaintext: true}})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "test.Claims",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Match", Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := &structpb.Struct{}
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) { handled.Add(1); return &structpb.Struct{}, nil }
			return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/test.Claims/Match"}, h)
		}}},
		Streams: []grpc.StreamDesc{{StreamName: "WatchMatches", ServerStreams: true, Handler: func(_ any, ss grpc.ServerStream) error {
			if err := ss.RecvMsg(&structpb.Struct{}); err != nil {
				return err
			}
			handled.Add(1)
			return ss.SendMsg(&structpb.Struct{})
		}}},
	}, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis, time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	srv.SetServing(true)
	cc := dial(t, lis.Addr().String(), grpcutil.TLSFiles{InsecurePlaintext: true})

	deep, err := proto.Marshal(deepStruct(5000))
	if err != nil {
		t.Fatal(err)
	}
	ok, _ := proto.Marshal(deepStruct(50))
	unary := func(body []byte) error {
		var out []byte
		return cc.Invoke(ctxTimeout(t), "/test.Claims/Match", body, &out, grpc.ForceCodecV2(rawCodec{}))
	}
	stream := func(body []byte) error {
		s, err := cc.NewStream(ctxTimeout(t), &grpc.StreamDesc{ServerStreams: true}, "/test.Claims/WatchMatches", grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			return err
		}
		if err := s.SendMsg(body); err != nil {
			return err
		}
		if err := s.CloseSend(); err != nil {
			return err
		}
		var out []byte
		return s.RecvMsg(&out)
	}
	for _, tc := range []struct {
		name string
		body []byte
		want string
	}{
		{"too deep", deep, "exceeded maximum recursion depth"},
		{"not protobuf", []byte{0xff, 0xff, 0xff, 0xff}, "cannot parse"},
	} {
		for kind, call := range map[string]func([]byte) error{"unary": unary, "stream": stream} {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				logs.Reset()
				before := handled.Load()
				err := call(tc.body)
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
					t.Fatalf("%v, want InvalidArgument saying %q", err, tc.want)
				}
				if handled.Load() != before {
					t.Errorf("the handler ran")
				}
				l := logs.String()
				if !strings.Contains(l, "grpc call rejected") || !strings.Contains(l, "code=InvalidArgument") || !strings.Contains(l, tc.want) {
					t.Errorf("log:\n%s", l)
				}
			})
		}
	}
	// What decodes is served as before.
	if err := unary(ok); err != nil {
		t.Fatalf("a Struct 50 levels deep: %v", err)
	}
	if err := stream(ok); err != nil {
		t.Fatalf("a Struct 50 levels deep, streamed: %v", err)
	}
	if handled.Load() != 2 {
		t.Fatalf("handled %d, want 2", handled.Load())
	}
}
