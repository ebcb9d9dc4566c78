package binder

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/auth"
	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// forwardedHeader marks a call one replica passed to another, so that two
// replicas with different views of the ring never pass it back and forth.
const forwardedHeader = "volplane-forwarded-by"

// peers knows the other binder replicas and keeps a connection to each, so
// that a sync request reaching the wrong replica (e.g. through a Service)
// is passed to the one that owns the object.
type peers struct {
	self    string
	ring    func() *coord.Ring
	mu      sync.Mutex
	members map[string]string // id -> address
	conns   map[string]*grpc.ClientConn
	tls     grpcutil.TLSFiles // to dial the other replicas
}

func newPeers(self string, ring func() *coord.Ring, tls grpcutil.TLSFiles) *peers {
	return &peers{self: self, ring: ring, members: map[string]string{}, conns: map[string]*grpc.ClientConn{}, tls: tls}
}

// update records the live members and closes connections to gone ones.
func (p *peers) update(ms []coord.Member) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.members = map[string]string{}
	for _, m := range ms {
		p.members[m.ID] = m.Address
	}
	for id, cc := range p.conns {
		if _, ok := p.members[id]; !ok {
			cc.Close()
			delete(p.conns, id)
		}
	}
}

func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, cc := range p.conns {
		cc.Close()
		delete(p.conns, id)
	}
}

// owner returns a client for the replica that owns key, or nil when this
// replica does.
func (p *peers) owner(ctx context.Context, key string) (binderv1.BinderServiceClient, string, error) {
	id := p.ring().Owner(key)
	if id == p.self || id == "" {
		return nil, "", nil
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(forwardedHeader)) > 0 {
		return nil, "", status.Errorf(codes.Unavailable, "%s is owned by binder replica %s by this replica's view, and replica %s thinks otherwise: membership is changing, retry shortly", key, id, md.Get(forwardedHeader)[0])
	}
	client, _, err := p.client(id)
	if err != nil {
		return nil, "", status.Errorf(codes.Unavailable, "%s is owned by binder replica %s: %v", key, id, err)
	}
	return client, id, nil
}

// errUnknownAddress: a member the ring names is not (or no longer) among
// the live members this replica knows, so it has no address for it.
var errUnknownAddress = errors.New("its address is not known (it is not, or not yet, a live member by this replica's view): membership is changing, retry shortly")

// client returns a client for the replica id, and its address.
func (p *peers) client(id string) (binderv1.BinderServiceClient, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	addr, ok := p.members[id]
	if !ok {
		return nil, "", errUnknownAddress
	}
	if cc := p.conns[id]; cc != nil {
		return binderv1.NewBinderServiceClient(cc), addr, nil
	}
	cc, err := grpcutil.Dial(addr, p.tls)
	if err != nil {
		return nil, addr, fmt.Errorf("reach it at %s: %w", addr, err)
	}
	p.conns[id] = cc
	return binderv1.NewBinderServiceClient(cc), addr, nil
}

// forwardContext marks ctx as forwarded by this replica, and passes on the
// end user the gateway named.
func (p *peers) forwardContext(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(auth.ForwardIncoming(ctx), forwardedHeader, p.self)
}

// forwardErr is the error of a call passed to replica id: the owner's own
// answer as it is, and a failure to reach it (Unavailable, a deadline)
// naming the replica, so the caller knows which one did not answer.
func forwardErr(id string, err error) error {
	st, ok := status.FromError(err)
	switch {
	case err == nil:
		return nil
	case !ok:
		return status.Errorf(codes.Unavailable, "forward to binder replica %s: %v", id, err)
	case st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded:
		return status.Errorf(st.Code(), "binder replica %s, the owner: %s", id, st.Message())
	}
	return err
}

// atOwner sends a request about the object with ring key to the replica
// that owns it, with call; forwarded is false when this replica owns it
// (or runs alone) and answers itself.
func atOwner[Resp any](ctx context.Context, p *peers, key string, call func(binderv1.BinderServiceClient, context.Context) (Resp, error)) (resp Resp, forwarded bool, err error) {
	if p == nil {
		return resp, false, nil
	}
	owner, id, err := p.owner(ctx, key)
	if err != nil {
		return resp, true, err
	}
	if owner == nil {
		return resp, false, nil
	}
	resp, err = call(owner, p.forwardContext(ctx))
	return resp, true, forwardErr(id, err)
}
