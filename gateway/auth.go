package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/volplane/volplane/pkg/auth"
	"github.com/volplane/volplane/pkg/kube"
)

// apiGrace is how long the API server may not answer before the gateway
// is not ready: without it no caller can be authenticated or authorized.
const apiGrace = 5 * time.Second

// AuthOptions configures who may call the gateway. There is no way to turn
// authentication off: every request but /healthz, /readyz and
// /openapi.json carries a bearer token (checked by a TokenReview) or a
// client certificate (checked against ClientCAFile), or is anonymous only
// when AllowAnonymous says so; and every request is authorized by a
// SubjectAccessReview against the cluster's RBAC. Both reviews need a
// Kubernetes client, so the zero AuthOptions uses client-go's loading
// rules and fails where they find no configuration.
type AuthOptions struct {
	// Kubeconfig is the kubeconfig of the client that creates the
	// TokenReviews and SubjectAccessReviews (--kubeconfig); empty means
	// client-go's loading rules (kube.ClientOptions.Kubeconfig). It needs
	// only the rights of the volplane-gateway ClusterRole
	// (deploy/kubernetes/rbac.yaml).
	Kubeconfig string
	// RESTConfig, when set, is used instead of Kubeconfig (tests).
	RESTConfig *rest.Config
	// Client, when set, is used instead of both (unit tests with a fake).
	Client kubernetes.Interface
	// ClientCAFile holds the PEM CAs that sign client certificates
	// (--client-ca-file); empty accepts no certificate. The certificate's
	// CN is the user and its O the groups, as for the API server. The file
	// is read again when it changes.
	ClientCAFile string
	// AllowAnonymous serves requests without credentials as user
	// system:anonymous in group system:unauthenticated, still authorized
	// by RBAC (--allow-anonymous). Off by default.
	AllowAnonymous bool
	// TokenAudiences, when set, must include one of the audiences the
	// TokenReview returns (--authentication-token-audiences); empty accepts
	// tokens for the API server itself.
	TokenAudiences []string
	// TokenCacheTTL is how long a token review is reused
	// (--authentication-token-cache-ttl); zero means 10s, negative turns
	// the cache off. Rejected tokens are reused for at most 2s.
	TokenCacheTTL time.Duration
	// AllowedCacheTTL and DeniedCacheTTL are how long an authorization
	// decision is reused (--authorization-cache-allowed-ttl,
	// --authorization-cache-denied-ttl); zero means 5m and 30s, negative
	// turns the cache off.
	AllowedCacheTTL, DeniedCacheTTL time.Duration
}

// guard authenticates and authorizes requests.
type guard struct {
	tokens    *auth.TokenAuthenticator
	certs     *auth.CertAuthenticator // nil without a client CA
	anonymous bool
	authz     *auth.Authorizer
	// limits holds each user's expensive requests (expensive.go).
	limits *limiter
	log    *slog.Logger
	// api probes the API server that reviews callers; apiCheck says
	// whether it has been failing for longer than apiGrace (readiness).
	api      *kube.APIProbe
	apiCheck func() error
	// backends are the configured backends by gRPC service name.
	backends map[string]*backend
	// client is the API client (standalone mode reads claims with it).
	client kubernetes.Interface
}

func newGuard(o AuthOptions, log *slog.Logger) (*guard, error) {
	cs := o.Client
	if cs == nil {
		var err error
		cs, err = kube.Client(o.RESTConfig, kube.ClientOptions{Kubeconfig: o.Kubeconfig, UserAgent: "volplane-gateway"})
		if err != nil {
			return nil, fmt.Errorf("the gateway authenticates and authorizes callers with the Kubernetes API: %w", err)
		}
	}
	g := &guard{anonymous: o.AllowAnonymous, log: log, api: kube.NewAPIProbe(cs), client: cs}
	g.apiCheck = func() error { return g.api.Check(apiGrace) }
	var err error
	if g.tokens, err = auth.NewTokenAuthenticator(auth.TokenOptions{
		Reviews: cs.AuthenticationV1().TokenReviews(), TTL: o.TokenCacheTTL, Audiences: o.TokenAudiences,
	}); err != nil {
		return nil, err
	}
	if o.ClientCAFile != "" {
		if g.certs, err = auth.NewCertAuthenticator(auth.CertOptions{CAFile: o.ClientCAFile, Logger: log}); err != nil {
			return nil, err
		}
	}
	if g.authz, err = auth.NewAuthorizer(auth.AuthorizerOptions{
		Reviews: cs.AuthorizationV1().SubjectAccessReviews(), AllowedTTL: o.AllowedCacheTTL, DeniedTTL: o.DeniedCacheTTL,
	}); err != nil {
		return nil, err
	}
	return g, nil
}

// authenticate returns the request's user, or the HTTP status and message
// to refuse it with. As the API server does, a valid client certificate
// wins, then a bearer token; a request that presents a credential that does
// not verify is refused, never served as anonymous.
func (g *guard) authenticate(ctx context.Context, r *http.Request) (auth.User, int, string) {
	var reasons []string
	if g.certs != nil && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		u, err := g.certs.AuthenticateCert(r.TLS.PeerCertificates)
		if err == nil {
			return g.checked(u)
		}
		reasons = append(reasons, err.Error())
	}
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, token, _ := strings.Cut(h, " ")
		token = strings.TrimSpace(token)
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			return auth.User{}, http.StatusUnauthorized, "the Authorization header must be \"Bearer <token>\""
		}
		u, err := g.tokens.AuthenticateToken(ctx, token)
		switch {
		case err == nil:
			return g.checked(u)
		case errors.Is(err, auth.ErrInvalid):
			reasons = append(reasons, err.Error())
		default:
			g.log.Warn("token review failed", "error", err)
			return auth.User{}, http.StatusServiceUnavailable, "the gateway could not check the bearer token with the Kubernetes API server; try again"
		}
	}
	if len(reasons) > 0 {
		return auth.User{}, http.StatusUnauthorized, "unauthorized: " + strings.Join(reasons, "; ")
	}
	if g.anonymous {
		return auth.Anonymous(), 0, ""
	}
	return auth.User{}, http.StatusUnauthorized, "unauthorized: send a bearer token (Authorization: Bearer <token>) or a client certificate"
}

// checked refuses identities that gRPC metadata cannot carry as they are:
// values must be printable ASCII, and groups are comma-joined.
func (g *guard) checked(u auth.User) (auth.User, int, string) {
	bad := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] > 0x7e {
				return true
			}
		}
		return false
	}
	if bad(u.Name) || bad(u.UID) {
		return auth.User{}, http.StatusUnauthorized, "unauthorized: the user name must be printable ASCII"
	}
	for _, grp := range u.Groups {
		if bad(grp) || strings.Contains(grp, ",") {
			return auth.User{}, http.StatusUnauthorized, "unauthorized: group names must be printable ASCII without commas"
		}
	}
	return u, 0, ""
}

// authorize decides a request on rt; it returns the HTTP status and message
// to refuse it with, or 0.
func (g *guard) authorize(ctx context.Context, u auth.User, rt *route, params map[string]string) (int, string) {
	a := rt.attributes(params)
	d, err := g.authz.Authorize(ctx, u, a)
	if err != nil {
		g.log.Warn("subject access review failed", "error", err)
		return http.StatusServiceUnavailable, "the gateway could not check the caller's rights with the Kubernetes API server; try again"
	}
	if !d.Allowed {
		return http.StatusForbidden, a.Forbidden(u, d.Reason)
	}
	return 0, ""
}
