package kubectlplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The Service the plugin finds the gateway by, and the annotations an
// administrator (or make up) puts on it: the URL the gateway is reached at
// from outside the cluster, and the CA (PEM) that signed its serving
// certificate.
const (
	DefaultGatewayService = "volplane-system/volplane-gateway"
	AnnotationGatewayURL  = "volplane.io/gateway-url"
	AnnotationGatewayCA   = "volplane.io/gateway-ca"
)

// kubeconfig loads the client configuration as kubectl does (cli-runtime's
// ConfigFlags): --kubeconfig, else the KUBECONFIG list, else
// ~/.kube/config; --context, --cluster, --user, --token,
// --client-certificate ... override the current context's; the namespace
// is -n, else the context's, else "default". Impersonation is refused:
// see impersonation.
func (o *options) kubeconfig() (*rest.Config, string, error) {
	f := o.config
	if *f.Impersonate != "" || *f.ImpersonateUID != "" || len(*f.ImpersonateGroup) > 0 || len(*f.ImpersonateUserExtra) > 0 {
		who := *f.Impersonate
		switch {
		case who != "":
		case len(*f.ImpersonateGroup) > 0:
			who = "groups " + strings.Join(*f.ImpersonateGroup, ",")
		case *f.ImpersonateUID != "":
			who = "uid " + *f.ImpersonateUID
		default:
			who = "user extras " + strings.Join(*f.ImpersonateUserExtra, ",")
		}
		return nil, "", usagef("--as %s: %w: %s", who, ErrImpersonation, impersonationHow)
	}
	cc := f.ToRawKubeConfigLoader()
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	if err := o.impersonation(cc, cfg); err != nil {
		return nil, "", err
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.Timeout = o.timeout
	return cfg, ns, nil
}

// ErrImpersonation is wrapped by the refusal of --as and its kin.
var ErrImpersonation = errors.New("the volplane gateway does not support impersonation")

// impersonationHow says why impersonation is refused and what to do.
const impersonationHow = "it authenticates the credential it receives and would act as that user. " +
	"Use a context whose user is the identity you want (e.g. a token from `kubectl create token`)"

// impersonation refuses a kubeconfig user that impersonates (its as:
// fields), as kubeconfig refuses --as, --as-group, --as-uid and
// --as-user-extra. The API server's impersonation is not the gateway's:
// the gateway authenticates the credential it receives and would act as
// that user, not as the one named, so a request "as" someone is refused
// rather than sent as someone else.
func (o *options) impersonation(cc clientcmd.ClientConfig, cfg *rest.Config) error {
	imp := cfg.Impersonate
	if imp.UserName == "" && imp.UID == "" && len(imp.Groups) == 0 && len(imp.Extra) == 0 {
		return nil
	}
	who := imp.UserName
	if who == "" {
		who = "groups " + strings.Join(imp.Groups, ",")
	}
	f := o.config
	user := *f.AuthInfoName
	if raw, err := cc.RawConfig(); err == nil && user == "" {
		ctx := raw.CurrentContext
		if *f.Context != "" {
			ctx = *f.Context
		}
		if c := raw.Contexts[ctx]; c != nil {
			user = c.AuthInfo
		}
	}
	return usagef("the kubeconfig's user %q impersonates %s (its as: fields): %w: %s", user, who, ErrImpersonation, impersonationHow)
}

// gateway is the REST gateway, called with the kubeconfig user's
// credentials.
type gateway struct {
	base *url.URL
	hc   *http.Client
	// noCredential: the kubeconfig user has neither a token nor a client
	// certificate nor a credential plugin (a 401 then says so).
	noCredential bool
}

// connect finds the gateway and builds a client that sends it what the
// kubeconfig user sends the API server: a bearer token (also from a token
// file, an exec or auth-provider plugin) or a client certificate. The
// gateway checks the token with a TokenReview and the certificate against
// its client CA, and authorizes by RBAC.
func (o *options) connect(ctx context.Context, cfg *rest.Config) (*gateway, error) {
	raw, ca, err := o.findGateway(ctx, cfg)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("gateway URL %q is not an http(s) URL", raw)
	}
	gw := rest.AnonymousClientConfig(cfg) // the cluster's settings without credentials
	gw.Host, gw.APIPath = u.Scheme+"://"+u.Host, ""
	// Credentials as the kubeconfig (and --token, --client-certificate)
	// has them. Impersonation was refused (see impersonation); basic
	// authentication is the API server's alone and is not sent.
	gw.BearerToken, gw.BearerTokenFile = cfg.BearerToken, cfg.BearerTokenFile
	gw.ExecProvider, gw.AuthProvider, gw.AuthConfigPersister = cfg.ExecProvider, cfg.AuthProvider, cfg.AuthConfigPersister
	gw.TLSClientConfig = rest.TLSClientConfig{
		CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, CertData: cfg.CertData, KeyData: cfg.KeyData,
		// The gateway's CA; none: the system's roots.
		CAData: ca,
	}
	gw.Timeout = o.timeout
	gw.UserAgent = "kubectl-volplane"
	hc, err := rest.HTTPClientFor(gw)
	if err != nil {
		return nil, fmt.Errorf("gateway client: %w", err)
	}
	g := &gateway{base: u, hc: hc}
	g.noCredential = cfg.BearerToken == "" && cfg.BearerTokenFile == "" && cfg.ExecProvider == nil && cfg.AuthProvider == nil &&
		cfg.CertFile == "" && len(cfg.CertData) == 0
	return g, nil
}

// findGateway returns the gateway's URL and CA (nil: the system's roots):
// --gateway and --certificate-authority, else the Service
// volplane-system/volplane-gateway (--gateway-service) read through the API
// server: its volplane.io/gateway-url annotation, else its load
// balancer's address, else, inside a cluster, its DNS name; its
// volplane.io/gateway-ca annotation gives the CA when
// --certificate-authority does not.
//
// The API server's service proxy is not used: the API server strips the
// caller's Authorization header once it has authenticated it, so the
// gateway would see no credential.
func (o *options) findGateway(ctx context.Context, cfg *rest.Config) (string, []byte, error) {
	var ca []byte
	if o.caFile != "" {
		b, err := os.ReadFile(o.caFile)
		if err != nil {
			return "", nil, fmt.Errorf("--certificate-authority: %w", err)
		}
		ca = b
	}
	if o.gatewayURL != "" {
		return o.gatewayURL, ca, nil
	}
	ns, name, ok := strings.Cut(o.gatewayService, "/")
	if !ok || ns == "" || name == "" {
		return "", nil, fmt.Errorf("--gateway-service %q: want NAMESPACE/NAME", o.gatewayService)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	svc, err := client.CoreV1().Services(ns).Get(cctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil, fmt.Errorf("there is no Service %s/%s to find the volplane gateway by: pass --gateway URL", ns, name)
	case err != nil:
		return "", nil, fmt.Errorf("cannot read Service %s/%s to find the volplane gateway (%v): pass --gateway URL", ns, name, err)
	}
	if ca == nil && svc.Annotations[AnnotationGatewayCA] != "" {
		ca = []byte(svc.Annotations[AnnotationGatewayCA])
	}
	if u := svc.Annotations[AnnotationGatewayURL]; u != "" {
		return u, ca, nil
	}
	port := servicePort(svc)
	for _, in := range svc.Status.LoadBalancer.Ingress {
		host := in.Hostname
		if host == "" {
			host = in.IP
		}
		if host != "" {
			return "https://" + net.JoinHostPort(host, strconv.Itoa(int(port))), ca, nil
		}
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return fmt.Sprintf("https://%s.%s.svc:%d", name, ns, port), ca, nil
	}
	//lint:ignore ST1005 Service is the Kubernetes kind, capitalized as kubectl writes it
	return "", nil, fmt.Errorf("Service %s/%s has no %s annotation and no load-balancer address, so the gateway cannot be reached from here: "+
		"pass --gateway URL (e.g. run `kubectl -n %s port-forward svc/%s 8443:%d` and pass --gateway https://localhost:8443 --certificate-authority CA-FILE)",
		ns, name, AnnotationGatewayURL, ns, name, port)
}

// servicePort is the Service's port named https, else its first.
func servicePort(svc *corev1.Service) int32 {
	for _, p := range svc.Spec.Ports {
		if p.Name == "https" {
			return p.Port
		}
	}
	if len(svc.Spec.Ports) > 0 {
		return svc.Spec.Ports[0].Port
	}
	return 443
}

// Error is the gateway's answer to a request it refused: the HTTP status
// and the gateway's message.
type Error struct {
	Status  int
	Message string
	// Hint says what to check, when the plugin knows.
	Hint string
}

// Error is the refusal as kubectl prints the API server's; the message
// (which may quote a driver) cannot move the terminal's cursor or color
// it.
func (e *Error) Error() string {
	s := fmt.Sprintf("Error from gateway (%d %s): %s", e.Status, http.StatusText(e.Status), printers.EscapeTerminal(e.Message))
	if e.Hint != "" {
		s += "\n" + e.Hint
	}
	return s
}

// do sends a request and returns the JSON object answered, or an *Error.
func (g *gateway) do(ctx context.Context, method, path string, query url.Values, body any) (*object, error) {
	u := *g.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the volplane gateway at %s: %w", g.base.Redacted(), err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("read the gateway's answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		// A match is a POST that writes nothing (a viewer's right).
		write := method != http.MethodGet && !strings.HasSuffix(path, ":match")
		return nil, g.refusal(resp.StatusCode, data, write)
	}
	o, err := decodeObject(data)
	if err != nil {
		return nil, fmt.Errorf("the gateway's answer to %s %s is not JSON: %w", method, path, err)
	}
	return o, nil
}

// refusal turns an error answer ({"code","message","details"}) into an
// *Error, with a hint for the refusals a user can fix; write: the request
// was one of the operator's.
func (g *gateway) refusal(code int, data []byte, write bool) error {
	e := &Error{Status: code}
	var body struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(data, &body) == nil && body.Message != "" {
		e.Message = body.Message
	} else {
		e.Message = strings.TrimSpace(string(data[:min(len(data), 300)]))
	}
	switch code {
	case http.StatusUnauthorized:
		if g.noCredential {
			e.Hint = "The kubeconfig's user has no token, client certificate or credential plugin to send: use a context whose user has one (e.g. `kubectl create token`), or --user."
		} else {
			e.Hint = "The gateway did not accept the kubeconfig user's credential: the token may have expired, be meant for another audience, or the client certificate not be signed by the gateway's client CA."
		}
	case http.StatusForbidden:
		e.Hint = "Ask for a binding to the volplane-viewer (read) or volplane-operator ClusterRole of deploy/kubernetes/roles.yaml."
		if write {
			e.Hint = "This command needs the volplane-operator ClusterRole of deploy/kubernetes/roles.yaml (volplane-viewer only reads): ask for a binding to it."
		}
	}
	return e
}

// listOptions says how to page through a list.
type listOptions struct {
	// field is the response's repeated field, e.g. "claims".
	field string
	// pageSize is sent as pageSize; 0 leaves the gateway's default.
	pageSize int32
	// keep lists the response fields besides field that are kept from the
	// last page (the orphan report's per-driver "drivers").
	keep []string
}

// list fetches every page of a list route and returns one object holding
// every item in field (and the keep fields of the last page).
func (g *gateway) list(ctx context.Context, path string, query url.Values, lo listOptions) (*object, error) {
	if query == nil {
		query = url.Values{}
	}
	if lo.pageSize > 0 {
		query.Set("pageSize", strconv.Itoa(int(lo.pageSize)))
	}
	out := newObject()
	items := []any{}
	for page := 0; ; page++ {
		resp, err := g.do(ctx, http.MethodGet, path, query, nil)
		if err != nil {
			return nil, err
		}
		items = append(items, resp.list(lo.field)...)
		for _, k := range lo.keep {
			out.set(k, resp.get(k))
		}
		next := resp.str("nextPageToken")
		if next == "" {
			break
		}
		if next == query.Get("pageToken") {
			return nil, errors.New("the gateway answered the same page token twice: stopping")
		}
		query.Set("pageToken", next)
	}
	out.set(lo.field, items)
	out.keys = append([]string{lo.field}, out.keys[:len(out.keys)-1]...)
	return out, nil
}

// timeoutOrDefault is the --request-timeout, 30s when unset.
func timeoutOrDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return 30 * time.Second
	}
	return d
}
