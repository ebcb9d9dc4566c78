package auth

import (
	"context"
	"strings"

	"google.golang.org/grpc/metadata"
)

// The gRPC metadata keys that carry the authenticated REST caller from the
// gateway to the services.
const (
	// MetadataUser is the caller's user name, e.g.
	// "system:serviceaccount:ns:name" or a certificate's CN.
	MetadataUser = "volplane-user"
	// MetadataGroups is the caller's groups, comma-joined.
	MetadataGroups = "volplane-groups"
	// MetadataUID is the caller's UID when the authenticator gives one.
	MetadataUID = "volplane-uid"
)

// Names of the anonymous identity (--allow-anonymous), as Kubernetes spells
// them.
const (
	AnonymousUser        = "system:anonymous"
	UnauthenticatedGroup = "system:unauthenticated"
	AuthenticatedGroup   = "system:authenticated"
)

// User is an authenticated caller.
type User struct {
	// Name is the user name.
	Name string
	// UID identifies the user across renames, when known.
	UID string
	// Groups the user belongs to.
	Groups []string
	// Extra holds the authenticator's extra attributes (a service account
	// token's pod and node, for example); they take part in authorization.
	Extra map[string][]string
}

// Anonymous is the identity of a request without credentials, when
// anonymous access is allowed.
func Anonymous() User {
	return User{Name: AnonymousUser, Groups: []string{UnauthenticatedGroup}}
}

// Metadata returns the gRPC metadata that carries u to a service.
func (u User) Metadata() metadata.MD {
	md := metadata.Pairs(MetadataUser, u.Name)
	if len(u.Groups) > 0 {
		md.Set(MetadataGroups, strings.Join(u.Groups, ","))
	}
	if u.UID != "" {
		md.Set(MetadataUID, u.UID)
	}
	return md
}

// FromIncomingContext returns the caller a gRPC server received in its
// metadata, and false when there is none (a call that did not come through
// the gateway). A service must trust it only from the gateway, which it
// knows by the gateway's client certificate.
func FromIncomingContext(ctx context.Context) (User, bool) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return User{}, false
	}
	names := md.Get(MetadataUser)
	if len(names) != 1 || names[0] == "" {
		return User{}, false
	}
	u := User{Name: names[0]}
	if v := md.Get(MetadataGroups); len(v) == 1 && v[0] != "" {
		u.Groups = strings.Split(v[0], ",")
	}
	if v := md.Get(MetadataUID); len(v) == 1 {
		u.UID = v[0]
	}
	return u, true
}

type userKey struct{}

// WithUser returns a context that carries u.
func WithUser(ctx context.Context, u User) context.Context {
	return context.WithValue(ctx, userKey{}, u)
}

// UserFrom returns the user WithUser stored in ctx.
func UserFrom(ctx context.Context) (User, bool) {
	u, ok := ctx.Value(userKey{}).(User)
	return u, ok
}

// ForwardIncoming returns ctx with the caller it received (if any) in its
// outgoing metadata, for a service that passes a call on to another
// replica: the replica that acts logs the same end user.
func ForwardIncoming(ctx context.Context) context.Context {
	u, ok := FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	return metadata.NewOutgoingContext(ctx, metadata.Join(outgoing(ctx), u.Metadata()))
}

func outgoing(ctx context.Context) metadata.MD {
	md, _ := metadata.FromOutgoingContext(ctx)
	return md
}
