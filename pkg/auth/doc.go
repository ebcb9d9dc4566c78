// Package auth authenticates and authorizes REST callers the way the
// Kubernetes API server delegates it (and kube-rbac-proxy does): a bearer
// token is checked with a TokenReview, a client certificate against a
// configured CA (user = CN, groups = O), and each request is allowed or
// denied by a SubjectAccessReview against the cluster's own RBAC, on a
// resource of volplane's API group (volplane.io).
//
// Both reviews are cached briefly, keyed by a hash (a token is never kept):
// token reviews for TokenTTL (failures for at most FailureTTL), access
// decisions for AllowedTTL when allowed and DeniedTTL when denied, as the
// API server's webhook authenticator and authorizer do. Errors reaching the
// API server are never cached. Concurrent identical reviews share one call.
//
// The identity travels to volplane's gRPC services as metadata under
// MetadataUser, MetadataGroups and MetadataUID: the gateway sets them after
// authenticating and drops any caller-supplied value, and a service reads
// them with FromIncomingContext. Only the gateway may set them, so services
// trust them only from a peer that mutual TLS identified as the gateway.
package auth
