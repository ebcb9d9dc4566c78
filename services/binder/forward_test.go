package binder

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
)

func TestPeersPassRequestsToTheOwner(t *testing.T) {
	ring := coord.NewRing([]string{"a", "b"})
	p := newPeers("a", func() *coord.Ring { return ring }, grpcutil.TLSFiles{InsecurePlaintext: true})
	defer p.close()
	var mine, theirs string
	for i := 0; mine == "" || theirs == ""; i++ {
		k := fmt.Sprintf("pvc/ns/c%d", i)
		if ring.Owner(k) == "a" {
			mine = k
		} else {
			theirs = k
		}
	}
	ctx := context.Background()
	if c, _, err := p.owner(ctx, mine); c != nil || err != nil {
		t.Fatalf("own key: client %v, err %v; want neither", c, err)
	}
	if _, _, err := p.owner(ctx, theirs); status.Code(err) != codes.Unavailable {
		t.Fatalf("owner's address unknown: %v, want Unavailable", err)
	}
	p.update([]coord.Member{{ID: "a", Address: "127.0.0.1:1"}, {ID: "b", Address: "127.0.0.1:2"}})
	c, id, err := p.owner(ctx, theirs)
	if c == nil || id != "b" || err != nil {
		t.Fatalf("other's key: client %v, id %q, err %v; want a client for b", c, id, err)
	}
	// A request another replica already passed on is not passed back.
	in := metadata.NewIncomingContext(ctx, metadata.Pairs(forwardedHeader, "b"))
	if _, _, err := p.owner(in, theirs); status.Code(err) != codes.Unavailable {
		t.Fatalf("forwarded twice: %v, want Unavailable", err)
	}
	p.update([]coord.Member{{ID: "a", Address: "127.0.0.1:1"}})
	if len(p.conns) != 0 {
		t.Fatalf("connection to a gone member kept: %v", p.conns)
	}
}

// A call passed to an owner that does not answer names the owner; the
// owner's own answers pass as they are.
func TestForwardErrNamesTheReplica(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		code codes.Code
		says string
	}{
		"unreachable":        {status.Error(codes.Unavailable, "connection refused"), codes.Unavailable, "binder replica b, the owner: connection refused"},
		"too slow":           {status.Error(codes.DeadlineExceeded, "deadline"), codes.DeadlineExceeded, "binder replica b"},
		"not a status":       {fmt.Errorf("boom"), codes.Unavailable, "forward to binder replica b: boom"},
		"the owner's answer": {status.Error(codes.NotFound, "claim ns/x not found"), codes.NotFound, "claim ns/x not found"},
	} {
		t.Run(name, func(t *testing.T) {
			err := forwardErr("b", tc.err)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%v: want %s saying %q", err, tc.code, tc.says)
			}
		})
	}
	if forwardErr("b", nil) != nil {
		t.Fatal("no error became one")
	}
}
