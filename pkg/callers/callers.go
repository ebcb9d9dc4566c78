package callers

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// The identities of volplane's callers: the Common Names of their
// certificates.
const (
	Watcher     = "volplane-watcher"
	Binder      = "volplane-binder"
	Provisioner = "volplane-provisioner"
	Reclaimer   = "volplane-reclaimer"
	Gateway     = "volplane-gateway"
	// Conformance is the test harness (volplane-conformance, the
	// project's end-to-end tests and chaos checks): every volplane RPC.
	Conformance = "volplane-conformance"
	// Any, in a table entry, allows every caller whose certificate the
	// TLS handshake verified.
	Any = "*"
)

// ServiceIdentity is the identity of the volplane service named service
// ("binder" is volplane-binder).
func ServiceIdentity(service string) string { return "volplane-" + service }

// Table maps a full method name ("/volplane.binder.v1.BinderService/GetClaim")
// to the identities allowed to call it. A method the table does not list
// is refused to everyone.
type Table map[string][]string

// services are who calls each volplane RPC in the course of its work,
// besides Conformance (Default adds it).
var services = Table{
	watcherv1.WatcherService_Watch_FullMethodName:     {Binder, Provisioner, Gateway},
	watcherv1.WatcherService_GetStatus_FullMethodName: {Binder, Provisioner, Gateway},

	// The binder forwards syncs, explanations and claim reads to the
	// replica that owns the object (only its cache holds the claim), and
	// asks every replica for its shard's part of a ListClaims page.
	binderv1.BinderService_ListClaims_FullMethodName:   {Gateway, Binder},
	binderv1.BinderService_GetClaim_FullMethodName:     {Gateway, Binder},
	binderv1.BinderService_ListVolumes_FullMethodName:  {Gateway},
	binderv1.BinderService_GetVolume_FullMethodName:    {Gateway},
	binderv1.BinderService_SyncClaim_FullMethodName:    {Gateway, Binder},
	binderv1.BinderService_SyncVolume_FullMethodName:   {Gateway, Binder},
	binderv1.BinderService_GetStatus_FullMethodName:    {Gateway},
	binderv1.BinderService_ExplainClaim_FullMethodName: {Gateway, Binder},
	binderv1.BinderService_MatchClaim_FullMethodName:   {Gateway},
	// A claim's timeline is answered by its owner, which asks the
	// provisioner for its part.
	binderv1.BinderService_GetClaimTimeline_FullMethodName: {Gateway, Binder},

	provisionerv1.ProvisionerService_Provision_FullMethodName:        {Binder, Gateway},
	provisionerv1.ProvisionerService_DeleteVolume_FullMethodName:     {Reclaimer, Gateway},
	provisionerv1.ProvisionerService_ListDrivers_FullMethodName:      {Binder, Reclaimer, Gateway},
	provisionerv1.ProvisionerService_ListOperations_FullMethodName:   {Binder, Gateway},
	provisionerv1.ProvisionerService_GetCapacity_FullMethodName:      {Gateway},
	provisionerv1.ProvisionerService_ListOrphans_FullMethodName:      {Gateway},
	provisionerv1.ProvisionerService_DeleteOrphan_FullMethodName:     {Gateway},
	provisionerv1.ProvisionerService_PlanVolume_FullMethodName:       {Binder},
	provisionerv1.ProvisionerService_GetClaimTimeline_FullMethodName: {Binder, Gateway},

	// The reclaimer forwards a retry to the replica holding the reclaim.
	reclaimerv1.ReclaimerService_Reclaim_FullMethodName:      {Binder, Gateway},
	reclaimerv1.ReclaimerService_GetReclaim_FullMethodName:   {Gateway},
	reclaimerv1.ReclaimerService_ListReclaims_FullMethodName: {Gateway},
	reclaimerv1.ReclaimerService_RetryReclaim_FullMethodName: {Gateway, Reclaimer},
}

// open are the methods every certificate of the CA may call.
var open = []string{
	healthpb.Health_Check_FullMethodName,
	healthpb.Health_Watch_FullMethodName,
	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName,
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName,
}

// Default is the table every volplane server enforces: the services'
// calls above, Conformance on every volplane RPC, and the health and
// reflection services open to Any. It returns a new copy each time.
func Default() Table {
	t := Table{}
	for m, ids := range services {
		t[m] = append(slices.Clone(ids), Conformance)
	}
	for _, m := range open {
		t[m] = []string{Any}
	}
	return t
}

// Allowed reports whether identity may call method.
func (t Table) Allowed(method, identity string) bool {
	ids := t[method]
	return identity != "" && (slices.Contains(ids, identity) || slices.Contains(ids, Any))
}

// Check returns nil when the caller of ctx (a server context) may call
// method, else a PermissionDenied error that names the caller's identity,
// the method and who may call it.
func (t Table) Check(ctx context.Context, method string) error {
	id := Identity(ctx)
	if t.Allowed(method, id) {
		return nil
	}
	if id == "" {
		return status.Errorf(codes.PermissionDenied, "%s needs a verified client certificate naming the calling service", method)
	}
	ids := t[method]
	if len(ids) == 0 {
		return status.Errorf(codes.PermissionDenied, "%q may not call %s: no caller may", id, method)
	}
	return status.Errorf(codes.PermissionDenied, "%q may not call %s: only %s may (the Common Name of the client certificate is the caller's identity)",
		id, method, strings.Join(ids, ", "))
}

// UnaryServerInterceptor refuses unary calls whose caller t does not
// allow.
func (t Table) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := t.Check(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor refuses streams whose caller t does not allow.
func (t Table) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := t.Check(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// Identity is the identity of the caller of ctx (a server context): the
// Common Name of the client certificate the TLS handshake verified; ""
// without one (plaintext).
func Identity(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return ""
	}
	return ti.State.VerifiedChains[0][0].Subject.CommonName
}
