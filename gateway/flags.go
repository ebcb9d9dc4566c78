package gateway

import (
	"strings"

	"github.com/spf13/pflag"

	"github.com/volplane/volplane/pkg/auth"
	"github.com/volplane/volplane/pkg/cmdutil"
)

// AuthFlags registers the flags of AuthOptions on fs.
func AuthFlags(fs *pflag.FlagSet, o *AuthOptions) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the client that checks callers with TokenReviews and SubjectAccessReviews; empty: the files $KUBECONFIG lists, else ~/.kube/config, else the in-cluster configuration")
	fs.StringVar(&o.ClientCAFile, "client-ca-file", "", "PEM CA certificates that sign client certificates (user = CN, groups = O); empty accepts none. Needs --tls-serving-cert-file")
	fs.BoolVar(&o.AllowAnonymous, "allow-anonymous", false, "serve requests without credentials as system:anonymous (group system:unauthenticated), still authorized by RBAC")
	cmdutil.Func(fs, "authentication-token-audiences", "strings", "comma-separated audiences a bearer token must be meant for; empty accepts tokens for the API server", func(s string) error {
		o.TokenAudiences = nil
		for _, a := range strings.Split(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				o.TokenAudiences = append(o.TokenAudiences, a)
			}
		}
		return nil
	})
	o.TokenCacheTTL, o.AllowedCacheTTL, o.DeniedCacheTTL = auth.DefaultTokenTTL, auth.DefaultAllowedTTL, auth.DefaultDeniedTTL
	fs.DurationVar(&o.TokenCacheTTL, "authentication-token-cache-ttl", o.TokenCacheTTL, "how long a token review is reused; negative turns the cache off")
	fs.DurationVar(&o.AllowedCacheTTL, "authorization-cache-allowed-ttl", o.AllowedCacheTTL, "how long an allowed authorization is reused; negative turns the cache off")
	fs.DurationVar(&o.DeniedCacheTTL, "authorization-cache-denied-ttl", o.DeniedCacheTTL, "how long a denied authorization is reused; negative turns the cache off")
}

// HTTPFlags registers the flags of HTTPOptions on fs.
func HTTPFlags(fs *pflag.FlagSet, o *HTTPOptions) {
	fs.StringVar(&o.TLSCertFile, "tls-serving-cert-file", "", "PEM certificate the gateway serves HTTPS with, reloaded when it changes; empty serves plain HTTP (bearer tokens only)")
	fs.StringVar(&o.TLSKeyFile, "tls-serving-key-file", "", "PEM key of --tls-serving-cert-file")
	fs.Int64Var(&o.MaxRequestBytes, "max-request-bytes", DefaultMaxRequestBytes, "largest request body accepted; larger gets 413")
	fs.DurationVar(&o.ReadHeaderTimeout, "read-header-timeout", DefaultReadHeaderTimeout, "time allowed to read a request's headers")
	fs.DurationVar(&o.ReadTimeout, "read-timeout", DefaultReadTimeout, "time allowed to read a whole request, body included")
	fs.DurationVar(&o.WriteTimeout, "write-timeout", DefaultWriteTimeout, "time allowed to write a response (/v1/watch streams without it)")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", DefaultIdleTimeout, "how long a kept-alive connection may wait for its next request")
	fs.IntVar(&o.MaxHeaderBytes, "max-header-bytes", DefaultMaxHeaderBytes, "largest request headers accepted")
	fs.IntVar(&o.MaxRequestDepth, "max-request-depth", DefaultMaxRequestDepth, "deepest nesting of objects and arrays in a JSON or YAML body; deeper gets 400")
	fs.IntVar(&o.MaxRequestElements, "max-request-elements", DefaultMaxRequestElements, "most values (object members and array elements, YAML aliases expanded) in a JSON or YAML body; more gets 400")
	fs.IntVar(&o.MaxRequestStringBytes, "max-request-string-bytes", DefaultMaxRequestStringBytes, "longest string in a JSON or YAML body, in bytes; longer gets 400")
	fs.IntVar(&o.MaxRequestKeyBytes, "max-request-key-bytes", DefaultMaxRequestKeyBytes, "longest object key in a JSON or YAML body, in bytes; longer gets 400")
}

// ExpensiveFlags registers the flags of ExpensiveOptions on fs.
func ExpensiveFlags(fs *pflag.FlagSet, o *ExpensiveOptions) {
	fs.Float64Var(&o.RequestsPerSecond, "expensive-requests-per-second", DefaultExpensiveRequestsPerSecond, "each user's sustained rate of expensive requests (match, explain, timeline, sync, provision, reclaim, orphans, capacity); more gets 429 with Retry-After")
	fs.IntVar(&o.Burst, "expensive-requests-burst", DefaultExpensiveRequestsBurst, "how many expensive requests a user may make at once before --expensive-requests-per-second applies")
	fs.IntVar(&o.MaxInFlightPerUser, "max-in-flight-expensive-per-user", DefaultMaxInFlightExpensivePerUser, "expensive requests one user may have in flight at once; more gets 429")
	fs.IntVar(&o.MaxInFlight, "max-in-flight-expensive", DefaultMaxInFlightExpensive, "expensive requests all users together may have in flight at once; more gets 429")
	fs.IntVar(&o.TrackedUsers, "expensive-tracked-users", DefaultExpensiveTrackedUsers, "users whose expensive-request limits the gateway remembers; beyond, the least recently seen idle user's are forgotten (bounds memory)")
}
