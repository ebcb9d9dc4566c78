package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/volplane/volplane/pkg/callers"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/test/harness/pki"
)

// Stranger is the name on a certificate of the services' CA that no table
// entry lists: a user's, as `make up` once printed one for the gateway.
const Stranger = "volplane-dev"

// CheckCallers calls every RPC of the service desc at addr, a real volplane
// service, with an empty request (which no handler acts on), as every
// identity the services' CA signs. A caller callers.Default() does not
// list gets PermissionDenied naming it and the RPC; a caller it lists gets
// past (the handler's answer: InvalidArgument, NotFound, a stream's first
// event, ...).
func (c *Cluster) CheckCallers(t *testing.T, addr string, desc *grpc.ServiceDesc) {
	t.Helper()
	stranger, err := c.CA.Issue(Stranger)
	if err != nil {
		t.Fatal(err)
	}
	certs := map[string]grpcutil.TLSFiles{Stranger: stranger, Client: c.TLS(Client)}
	for _, s := range pki.Services {
		certs[callers.ServiceIdentity(s)] = c.TLS(s)
	}
	table := callers.Default()
	for id, files := range certs {
		cc, err := grpcutil.Dial(addr, files)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range desc.Methods {
			method := "/" + desc.ServiceName + "/" + m.MethodName
			checkCall(t, table, id, method, cc.Invoke(callCtx(t), method, &emptypb.Empty{}, &emptypb.Empty{}))
		}
		for _, s := range desc.Streams {
			method := "/" + desc.ServiceName + "/" + s.StreamName
			checkCall(t, table, id, method, firstMessage(callCtx(t), cc, method))
		}
		cc.Close()
	}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// firstMessage opens a server stream, sends an empty request and waits
// for the first answer.
func firstMessage(ctx context.Context, cc *grpc.ClientConn, method string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
	if err != nil {
		return err
	}
	if err := s.SendMsg(&emptypb.Empty{}); err != nil {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	return s.RecvMsg(&emptypb.Empty{})
}

func checkCall(t *testing.T, table callers.Table, id, method string, err error) {
	t.Helper()
	denied := status.Code(err) == codes.PermissionDenied
	switch allowed := table.Allowed(method, id); {
	case allowed && denied:
		t.Errorf("%s calling %s: %v, want it let through", id, method, err)
	case allowed && status.Code(err) == codes.Unavailable:
		t.Errorf("%s calling %s: %v", id, method, err)
	case !allowed && !denied:
		t.Errorf("%s calling %s: %v, want PermissionDenied", id, method, err)
	case !allowed && !strings.Contains(status.Convert(err).Message(), fmt.Sprintf("%q may not call %s", id, method)):
		t.Errorf("%s calling %s: %q does not name the caller and the RPC", id, method, status.Convert(err).Message())
	}
}
