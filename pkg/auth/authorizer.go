package auth

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Group is the API group of volplane's resources in RBAC rules.
const Group = "volplane.io"

// AccessReviewer creates SubjectAccessReviews: a clientset's
// AuthorizationV1().SubjectAccessReviews().
type AccessReviewer interface {
	Create(ctx context.Context, review *authzv1.SubjectAccessReview, opts metav1.CreateOptions) (*authzv1.SubjectAccessReview, error)
}

// Attributes are what a request does, in RBAC's terms, on a resource of
// Group.
type Attributes struct {
	// Verb: get, list, watch, create, update or delete.
	Verb string
	// Resource, e.g. "claims".
	Resource string
	// Subresource, e.g. "sync"; empty for none.
	Subresource string
	// Namespace; empty for a cluster-scoped resource or all namespaces.
	Namespace string
	// Name of the object; empty for a collection.
	Name string
}

// resource is the resource as RBAC rules name it: "claims" or "claims/sync".
func (a Attributes) resource() string {
	if a.Subresource != "" {
		return a.Resource + "/" + a.Subresource
	}
	return a.Resource
}

// Forbidden is the message for a denied request, worded as the API
// server's: it names the user, the verb, the resource and subresource, the
// group and the namespace that a role binding must grant.
func (a Attributes) Forbidden(u User, reason string) string {
	var b strings.Builder
	if a.Name != "" {
		fmt.Fprintf(&b, "%s.%s %q is forbidden: ", a.Resource, Group, a.Name)
	} else {
		fmt.Fprintf(&b, "%s.%s is forbidden: ", a.Resource, Group)
	}
	fmt.Fprintf(&b, "User %q cannot %s resource %q in API group %q", u.Name, a.Verb, a.resource(), Group)
	if a.Namespace != "" {
		fmt.Fprintf(&b, " in the namespace %q", a.Namespace)
	} else {
		b.WriteString(" at the cluster scope")
	}
	if reason != "" {
		b.WriteString(": " + reason)
	}
	return b.String()
}

// Defaults of AuthorizerOptions, the API server's webhook authorizer's.
const (
	DefaultAllowedTTL = 5 * time.Minute
	DefaultDeniedTTL  = 30 * time.Second
)

// AuthorizerOptions configures an Authorizer.
type AuthorizerOptions struct {
	// Reviews creates the SubjectAccessReviews (required).
	Reviews AccessReviewer
	// AllowedTTL is how long an allowed decision is reused
	// (--authorization-cache-allowed-ttl); zero means DefaultAllowedTTL,
	// negative does not cache.
	AllowedTTL time.Duration
	// DeniedTTL is how long a denied decision is reused
	// (--authorization-cache-denied-ttl); zero means DefaultDeniedTTL,
	// negative does not cache.
	DeniedTTL time.Duration
	// MaxEntries bounds the cache; zero means 10,000.
	MaxEntries int
	// Now is the clock; nil means time.Now (tests set it).
	Now func() time.Time
}

// Authorizer decides with SubjectAccessReviews.
type Authorizer struct {
	o      AuthorizerOptions
	cache  *ttlCache[Decision]
	flight singleflight.Group
}

// Decision is an authorizer's answer.
type Decision struct {
	// Allowed is true when RBAC (or another authorizer of the cluster)
	// allows the request.
	Allowed bool
	// Reason is the API server's explanation, when it gives one.
	Reason string
}

// NewAuthorizer validates o and returns the authorizer.
func NewAuthorizer(o AuthorizerOptions) (*Authorizer, error) {
	if o.Reviews == nil {
		return nil, errors.New("authorization needs a SubjectAccessReview client")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.AllowedTTL = ttlOrDefault(o.AllowedTTL, DefaultAllowedTTL)
	o.DeniedTTL = ttlOrDefault(o.DeniedTTL, DefaultDeniedTTL)
	return &Authorizer{o: o, cache: newTTLCache[Decision](o.MaxEntries, o.Now)}, nil
}

// Authorize asks whether u may do a. An error means the API server could
// not be asked; it is not cached.
func (z *Authorizer) Authorize(ctx context.Context, u User, a Attributes) (Decision, error) {
	key := reviewKey(u, a)
	if d, ok := z.cache.get(key); ok {
		return d, nil
	}
	v, err, _ := z.flight.Do(key, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		d, err := z.review(rctx, u, a)
		if err != nil {
			return nil, err
		}
		ttl := z.o.DeniedTTL
		if d.Allowed {
			ttl = z.o.AllowedTTL
		}
		z.cache.set(key, d, ttl)
		return d, nil
	})
	if err != nil {
		return Decision{}, err
	}
	return v.(Decision), nil
}

func (z *Authorizer) review(ctx context.Context, u User, a Attributes) (Decision, error) {
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:   u.Name,
		UID:    u.UID,
		Groups: u.Groups,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Group:       Group,
			Verb:        a.Verb,
			Resource:    a.Resource,
			Subresource: a.Subresource,
			Namespace:   a.Namespace,
			Name:        a.Name,
		},
	}}
	if len(u.Extra) > 0 {
		sar.Spec.Extra = make(map[string]authzv1.ExtraValue, len(u.Extra))
		for k, v := range u.Extra {
			sar.Spec.Extra[k] = v
		}
	}
	out, err := z.o.Reviews.Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return Decision{}, fmt.Errorf("subject access review: %w", err)
	}
	reason := out.Status.Reason
	if out.Status.EvaluationError != "" && !out.Status.Allowed {
		reason = strings.TrimSpace(reason + " " + out.Status.EvaluationError)
	}
	return Decision{Allowed: out.Status.Allowed && !out.Status.Denied, Reason: reason}, nil
}

// reviewKey identifies a review by everything that takes part in it.
func reviewKey(u User, a Attributes) string {
	parts := []string{u.Name, u.UID, strings.Join(u.Groups, "\x00"),
		a.Verb, a.Resource, a.Subresource, a.Namespace, a.Name}
	keys := make([]string, 0, len(u.Extra))
	for k := range u.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, k, strings.Join(u.Extra[k], "\x00"))
	}
	return hashKey(parts...)
}
