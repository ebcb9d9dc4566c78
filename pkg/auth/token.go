package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ErrInvalid marks a credential that was checked and rejected (401). Any
// other error from an authenticator means it could not decide (the API
// server is unreachable, for example: 503).
var ErrInvalid = errors.New("invalid credential")

// TokenReviewer creates TokenReviews: a clientset's
// AuthenticationV1().TokenReviews().
type TokenReviewer interface {
	Create(ctx context.Context, review *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error)
}

// Defaults of TokenOptions.
const (
	DefaultTokenTTL        = 10 * time.Second
	DefaultTokenFailureTTL = 2 * time.Second
)

// TokenOptions configures a TokenAuthenticator.
type TokenOptions struct {
	// Reviews creates the TokenReviews (required).
	Reviews TokenReviewer
	// TTL is how long a successful review is reused
	// (--authentication-token-cache-ttl); zero means DefaultTokenTTL,
	// negative turns the cache off.
	TTL time.Duration
	// FailureTTL is how long a rejected token stays rejected without a new
	// review; zero means DefaultTokenFailureTTL, and it is never longer than
	// TTL.
	FailureTTL time.Duration
	// Audiences, when set, must share one audience with the token's; empty
	// accepts the API server's own audiences.
	Audiences []string
	// MaxEntries bounds the cache; zero means 10,000.
	MaxEntries int
	// Now is the clock; nil means time.Now (tests set it).
	Now func() time.Time
}

// TokenAuthenticator checks bearer tokens with TokenReviews.
type TokenAuthenticator struct {
	o      TokenOptions
	cache  *ttlCache[tokenResult]
	flight singleflight.Group
}

type tokenResult struct {
	user   User
	reason string // why the token was rejected; empty when it was not
}

// NewTokenAuthenticator validates o and returns the authenticator.
func NewTokenAuthenticator(o TokenOptions) (*TokenAuthenticator, error) {
	if o.Reviews == nil {
		return nil, errors.New("token authentication needs a TokenReview client")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.TTL = ttlOrDefault(o.TTL, DefaultTokenTTL)
	o.FailureTTL = min(ttlOrDefault(o.FailureTTL, DefaultTokenFailureTTL), o.TTL)
	return &TokenAuthenticator{o: o, cache: newTTLCache[tokenResult](o.MaxEntries, o.Now)}, nil
}

// AuthenticateToken returns the token's user, an error wrapping ErrInvalid
// when the API server rejects it, or another error when it could not be
// asked. The error never contains the token.
func (a *TokenAuthenticator) AuthenticateToken(ctx context.Context, token string) (User, error) {
	if token == "" {
		return User{}, fmt.Errorf("%w: empty bearer token", ErrInvalid)
	}
	key := hashKey(token)
	res, ok := a.cache.get(key)
	if !ok {
		v, err, _ := a.flight.Do(key, func() (any, error) {
			// A caller that goes away must not fail the others waiting on
			// the same review.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			res, err := a.review(rctx, token)
			if err != nil {
				return nil, err
			}
			ttl := a.o.TTL
			if res.reason != "" {
				ttl = a.o.FailureTTL
			}
			a.cache.set(key, res, ttl)
			return res, nil
		})
		if err != nil {
			return User{}, err
		}
		res = v.(tokenResult)
	}
	if res.reason != "" {
		return User{}, fmt.Errorf("%w: %s", ErrInvalid, res.reason)
	}
	return res.user, nil
}

func (a *TokenAuthenticator) review(ctx context.Context, token string) (tokenResult, error) {
	tr, err := a.o.Reviews.Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: a.o.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return tokenResult{}, fmt.Errorf("token review: %w", err)
	}
	st := tr.Status
	switch {
	case !st.Authenticated:
		reason := "the API server did not authenticate the bearer token"
		if st.Error != "" {
			reason += " (" + st.Error + ")"
		}
		return tokenResult{reason: reason}, nil
	case st.User.Username == "":
		return tokenResult{reason: "the token review names no user"}, nil
	case len(a.o.Audiences) > 0 && !slices.ContainsFunc(st.Audiences, func(s string) bool { return slices.Contains(a.o.Audiences, s) }):
		return tokenResult{reason: fmt.Sprintf("the token is not meant for this gateway (audiences %v, want one of %v)", st.Audiences, a.o.Audiences)}, nil
	}
	u := User{Name: st.User.Username, UID: st.User.UID, Groups: st.User.Groups}
	if len(st.User.Extra) > 0 {
		u.Extra = make(map[string][]string, len(st.User.Extra))
		for k, v := range st.User.Extra {
			u.Extra[k] = v
		}
	}
	return tokenResult{user: u}, nil
}
