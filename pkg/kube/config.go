package kube

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ClientOptions configures the connection to the Kubernetes API.
type ClientOptions struct {
	// Kubeconfig is the path of a kubeconfig file. Empty means client-go's
	// loading rules, as kubectl's: the files $KUBECONFIG lists (merged),
	// else ~/.kube/config, else the in-cluster configuration.
	Kubeconfig string
	// Context is the kubeconfig context to use; empty means its
	// current-context.
	Context string
	// QPS limits requests per second on the client side; 0 or less means no
	// client-side limit (the API server's own priority and fairness still
	// applies).
	QPS float32
	// Burst is the client-side burst when QPS is set.
	Burst int
	// UserAgent names the component in the API server's logs and metrics.
	UserAgent string
}

// RateLimits resolves a service's --kube-api-qps and --kube-api-burst:
// a QPS of 0 is the service's default defQPS, a negative QPS no
// client-side limit at all; a burst of 0 is twice the QPS. The limit is a
// fuse against a runaway loop, not a throttle: the API server's priority
// and fairness (deploy/kubernetes/flowcontrol.yaml) is what shares its
// capacity, by flow, knowing its load; so the defaults sit well above what
// a replica needs at its benchmarked peak, where kube-controller-manager's
// 20 QPS would cap its binder at about 5 binds a second.
func RateLimits(qps *float32, burst *int, defQPS float32) error {
	if *burst < 0 {
		return fmt.Errorf("kubernetes client burst must not be negative, got %d (--kube-api-burst)", *burst)
	}
	if *qps == 0 {
		*qps = defQPS
	}
	if *qps > 0 && *burst == 0 {
		*burst = int(2 * *qps)
	}
	return nil
}

// RESTConfig builds a REST config that speaks protobuf and is not throttled
// unless QPS asks for it.
func RESTConfig(o ClientOptions) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: o.Context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config (set --kubeconfig or $KUBECONFIG outside a cluster): %w", err)
	}
	return Tune(cfg, o), nil
}

// Tune sets protobuf, the rate limits and the user agent on a copy of cfg.
func Tune(cfg *rest.Config, o ClientOptions) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if o.QPS > 0 {
		cfg.QPS = o.QPS
		cfg.Burst = max(o.Burst, int(o.QPS))
	} else {
		// A negative QPS disables client-go's token bucket.
		cfg.QPS = -1
	}
	if o.UserAgent != "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent() + " " + o.UserAgent
	}
	return cfg
}

// NewClientset builds a clientset from the options.
func NewClientset(o ClientOptions) (kubernetes.Interface, *rest.Config, error) {
	cfg, err := RESTConfig(o)
	if err != nil {
		return nil, nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes clientset: %w", err)
	}
	return cs, cfg, nil
}

// Client returns a clientset for cfg when given (tests), else for the
// kubeconfig or in-cluster configuration o names, tuned by o.
func Client(cfg *rest.Config, o ClientOptions) (kubernetes.Interface, error) {
	if cfg == nil {
		var err error
		if cfg, err = RESTConfig(o); err != nil {
			return nil, err
		}
	} else {
		cfg = Tune(cfg, o)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, nil
}
