package gateway

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/volplane/volplane/pkg/auth"
)

// route is one REST route of proto/volplane/http.yaml and what it does in
// RBAC's terms: every request is authorized as a SubjectAccessReview of
// Verb on Resource/Subresource in volplane.io, in the namespace and on the
// object its path names.
type route struct {
	// Method and Path are the HTTP method and path template exactly as
	// proto/volplane/http.yaml spells them.
	Method, Path string
	// RPC is the gRPC method, as http.yaml's selector names it.
	RPC string
	// Verb, Resource and Subresource are the RBAC rule a caller needs.
	Verb, Resource, Subresource string
	// Name is the object's name when it is fixed (the status of a
	// service); otherwise the path parameter "name" or "volume_name" gives
	// it, if the path has one.
	Name string
	// Stream marks a streaming response (no write deadline).
	Stream bool
	// Expensive marks a route that makes the API server, a CSI driver or a
	// service work for the caller (a dry run, a sync, a CSI call, a
	// reclaim): each user's rate and concurrency on these is limited
	// (ExpensiveOptions), 429 beyond.
	Expensive bool
}

// routes is the one table that authorizes the REST API. The gateway looks
// a request up by the method and the path pattern grpc-gateway matched, so
// a route that is served has an entry here or is refused (403); a test
// checks that every rule of http.yaml has one.
var routes = []route{
	// watcher
	{Method: "GET", Path: "/v1/watch", RPC: "volplane.watcher.v1.WatcherService.Watch", Verb: "watch", Resource: "events", Stream: true},
	{Method: "GET", Path: "/v1/watcher/status", RPC: "volplane.watcher.v1.WatcherService.GetStatus", Verb: "get", Resource: "status", Name: "watcher"},
	// binder
	{Method: "GET", Path: "/v1/claims", RPC: "volplane.binder.v1.BinderService.ListClaims", Verb: "list", Resource: "claims"},
	{Method: "GET", Path: "/v1/namespaces/{namespace}/claims", RPC: "volplane.binder.v1.BinderService.ListClaims", Verb: "list", Resource: "claims"},
	{Method: "GET", Path: "/v1/namespaces/{namespace}/claims/{name}", RPC: "volplane.binder.v1.BinderService.GetClaim", Verb: "get", Resource: "claims"},
	{Method: "GET", Path: "/v1/volumes", RPC: "volplane.binder.v1.BinderService.ListVolumes", Verb: "list", Resource: "volumes"},
	{Method: "GET", Path: "/v1/volumes/{name}", RPC: "volplane.binder.v1.BinderService.GetVolume", Verb: "get", Resource: "volumes"},
	{Method: "POST", Path: "/v1/namespaces/{namespace}/claims/{name}:sync", RPC: "volplane.binder.v1.BinderService.SyncClaim", Verb: "update", Resource: "claims", Subresource: "sync", Expensive: true},
	{Method: "POST", Path: "/v1/volumes/{name}:sync", RPC: "volplane.binder.v1.BinderService.SyncVolume", Verb: "update", Resource: "volumes", Subresource: "sync", Expensive: true},
	{Method: "GET", Path: "/v1/binder/status", RPC: "volplane.binder.v1.BinderService.GetStatus", Verb: "get", Resource: "status", Name: "binder"},
	{Method: "GET", Path: "/v1/namespaces/{namespace}/claims/{name}:explain", RPC: "volplane.binder.v1.BinderService.ExplainClaim", Verb: "get", Resource: "claims", Subresource: "explain", Expensive: true},
	{Method: "GET", Path: "/v1/namespaces/{namespace}/claims/{name}:timeline", RPC: "volplane.binder.v1.BinderService.GetClaimTimeline", Verb: "get", Resource: "claims", Subresource: "timeline", Expensive: true},
	// A match reads (a dry run writes nothing): get, which viewers have.
	{Method: "POST", Path: "/v1/claims:match", RPC: "volplane.binder.v1.BinderService.MatchClaim", Verb: "get", Resource: "claims", Subresource: "match", Expensive: true},
	{Method: "POST", Path: "/v1/namespaces/{namespace}/claims:match", RPC: "volplane.binder.v1.BinderService.MatchClaim", Verb: "get", Resource: "claims", Subresource: "match", Expensive: true},
	// provisioner
	{Method: "POST", Path: "/v1/provisions", RPC: "volplane.provisioner.v1.ProvisionerService.Provision", Verb: "create", Resource: "provisions", Expensive: true},
	{Method: "POST", Path: "/v1/volumes/{volume_name}:deleteBacking", RPC: "volplane.provisioner.v1.ProvisionerService.DeleteVolume", Verb: "delete", Resource: "volumes", Subresource: "backing", Expensive: true},
	{Method: "GET", Path: "/v1/drivers", RPC: "volplane.provisioner.v1.ProvisionerService.ListDrivers", Verb: "list", Resource: "drivers"},
	{Method: "GET", Path: "/v1/provisioner/operations", RPC: "volplane.provisioner.v1.ProvisionerService.ListOperations", Verb: "list", Resource: "operations"},
	{Method: "GET", Path: "/v1/drivers/{name}/capacity", RPC: "volplane.provisioner.v1.ProvisionerService.GetCapacity", Verb: "get", Resource: "drivers", Subresource: "capacity", Expensive: true},
	{Method: "GET", Path: "/v1/orphans", RPC: "volplane.provisioner.v1.ProvisionerService.ListOrphans", Verb: "list", Resource: "orphans", Expensive: true},
	{Method: "POST", Path: "/v1/orphans:delete", RPC: "volplane.provisioner.v1.ProvisionerService.DeleteOrphan", Verb: "delete", Resource: "orphans", Expensive: true},
	// reclaimer
	{Method: "POST", Path: "/v1/reclaims", RPC: "volplane.reclaimer.v1.ReclaimerService.Reclaim", Verb: "create", Resource: "reclaims", Expensive: true},
	{Method: "GET", Path: "/v1/reclaims/{volume_name}", RPC: "volplane.reclaimer.v1.ReclaimerService.GetReclaim", Verb: "get", Resource: "reclaims"},
	{Method: "GET", Path: "/v1/reclaims", RPC: "volplane.reclaimer.v1.ReclaimerService.ListReclaims", Verb: "list", Resource: "reclaims"},
	{Method: "POST", Path: "/v1/reclaims/{volume_name}:retry", RPC: "volplane.reclaimer.v1.ReclaimerService.RetryReclaim", Verb: "update", Resource: "reclaims", Subresource: "retry", Expensive: true},
}

// routeIndex maps "METHOD /path/{template}" to its route.
var routeIndex = func() map[string]*route {
	m := make(map[string]*route, len(routes))
	for i := range routes {
		m[routes[i].Method+" "+routes[i].Path] = &routes[i]
	}
	return m
}()

// capture matches grpc-gateway's rendering of a path variable, "{name=*}".
var capture = regexp.MustCompile(`\{([a-z_]+)=\*\}`)

// lookupRoute returns the route of a request that grpc-gateway matched to
// pattern (runtime.Pattern.String()).
func lookupRoute(method, pattern string) (*route, bool) {
	rt, ok := routeIndex[method+" "+capture.ReplaceAllString(pattern, "{$1}")]
	return rt, ok
}

// paramCheck validates one path parameter as the Kubernetes API validates
// the name it stands for.
type paramCheck struct {
	// field names the parameter in error messages.
	field string
	check func(string) []string
}

// pathParams are the path parameters of http.yaml and their validation; a
// test checks that every parameter of the table has one.
var pathParams = map[string]paramCheck{
	"namespace":   {"namespace", validation.IsDNS1123Label},
	"name":        {"name", validation.IsDNS1123Subdomain},
	"volume_name": {"volume name", validation.IsDNS1123Subdomain},
}

// validateParams returns the first path parameter that is not a valid
// Kubernetes name, worded for the caller to fix.
func validateParams(params map[string]string) error {
	for _, key := range []string{"namespace", "name", "volume_name"} {
		v, ok := params[key]
		if !ok {
			continue
		}
		pc := pathParams[key]
		if errs := pc.check(v); len(errs) > 0 {
			return fmt.Errorf("invalid %s %q in the path: %s", pc.field, truncate(v, 80), strings.Join(errs, "; "))
		}
	}
	for key := range params {
		if _, ok := pathParams[key]; !ok {
			return fmt.Errorf("unexpected path parameter %q", key)
		}
	}
	return nil
}

// attributes is what the request does in RBAC's terms.
func (rt *route) attributes(params map[string]string) auth.Attributes {
	a := auth.Attributes{Verb: rt.Verb, Resource: rt.Resource, Subresource: rt.Subresource,
		Namespace: params["namespace"], Name: rt.Name}
	if a.Name == "" {
		a.Name = params["name"]
	}
	if a.Name == "" {
		a.Name = params["volume_name"]
	}
	return a
}

// write reports whether the route changes state (logged at info level):
// its verb is not a read. A POST may read (a match sends its claim as the
// body and writes nothing).
func (rt *route) write() bool {
	return rt.Verb != "get" && rt.Verb != "list" && rt.Verb != "watch"
}

// matchPath reports whether path fits the route's template: the same
// number of segments, literals equal, variables non-empty, and the
// ":verb" suffix when the template has one. It answers only "which methods
// does this path allow" for a 405; grpc-gateway routes the requests.
func (rt *route) matchPath(path string) bool {
	tmpl, verb, _ := strings.Cut(strings.TrimPrefix(rt.Path, "/"), ":")
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	tsegs := strings.Split(tmpl, "/")
	if len(segs) != len(tsegs) {
		return false
	}
	if verb != "" {
		last, ok := strings.CutSuffix(segs[len(segs)-1], ":"+verb)
		if !ok {
			return false
		}
		segs[len(segs)-1] = last
	}
	for i, t := range tsegs {
		if strings.HasPrefix(t, "{") {
			if segs[i] == "" {
				return false
			}
		} else if segs[i] != t {
			return false
		}
	}
	return true
}

// allowedMethods lists the methods of the routes whose template fits path.
func allowedMethods(path string) []string {
	var out []string
	for i := range routes {
		rt := &routes[i]
		if rt.matchPath(path) && !slices.Contains(out, rt.Method) {
			out = append(out, rt.Method)
		}
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
