package csisidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/sidecar"
)

// saNamespaceFile is where a pod's ServiceAccount token mount names its
// namespace.
const saNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// podName is the sidecar's pod: $POD_NAME, else the hostname (a pod's
// hostname is its name). It is also the leader lock's identity, where
// csi-lib-utils takes the hostname: the same in a pod, and distinct for
// sidecars sharing a host outside one.
func podName() (string, error) {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n, nil
	}
	n, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("pod name: $POD_NAME is not set and the hostname is unknown: %w", err)
	}
	return n, nil
}

// podNamespace is the sidecar's namespace: $POD_NAMESPACE, $NAMESPACE,
// the ServiceAccount's namespace file, else fallback
// (--volplane-pod-namespace).
func podNamespace(fallback string) (string, error) {
	for _, env := range []string{"POD_NAMESPACE", "NAMESPACE"} {
		if ns := os.Getenv(env); ns != "" {
			return ns, nil
		}
	}
	if b, err := os.ReadFile(saNamespaceFile); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns, nil
		}
	}
	if fallback != "" {
		return fallback, nil
	}
	return "", errors.New("pod namespace: set $POD_NAMESPACE (the downward API's metadata.namespace) or --volplane-pod-namespace")
}

// registrar keeps the sidecar's registration Lease.
type registrar struct {
	client kubernetes.Interface
	reg    sidecar.Registration
	log    *slog.Logger
	every  time.Duration
	now    func() time.Time
}

// run writes the registration at once and every r.every until ctx ends,
// then deletes it. A failed write is logged (once until it succeeds
// again) and retried at the next tick.
func (r *registrar) run(ctx context.Context) {
	defer r.remove()
	failing := false
	for {
		err := r.write(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			r.log.Warn("cannot write the registration; retrying", "lease", r.reg.Namespace+"/"+sidecar.RegistrationName(r.reg.Pod), "error", err)
			failing = true
		case err == nil && failing:
			r.log.Info("registration written again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.every):
		}
	}
}

// write creates the Lease or renews it.
func (r *registrar) write(ctx context.Context) error {
	leases := r.client.CoordinationV1().Leases(r.reg.Namespace)
	want := r.reg.Lease(r.now())
	cur, err := leases.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if _, err := leases.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create lease %s: %w", want.Name, err)
		}
		r.log.Info("registered", "lease", want.Namespace+"/"+want.Name, "driver", r.reg.Driver, "port", r.reg.Port, "certSHA256", r.reg.CertSHA256)
		return nil
	}
	if err != nil {
		return fmt.Errorf("get lease %s: %w", want.Name, err)
	}
	renew(cur, want)
	if _, err := leases.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("renew lease %s: %w", want.Name, err)
	}
	return nil
}

// renew makes cur say what want says, keeping cur's other labels and
// annotations and its resourceVersion.
func renew(cur, want *coordinationv1.Lease) {
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	for k, v := range want.Labels {
		cur.Labels[k] = v
	}
	for k, v := range want.Annotations {
		cur.Annotations[k] = v
	}
	cur.Spec = want.Spec
}

// remove deletes the registration, with its own short deadline since the
// sidecar is stopping.
func (r *registrar) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	name := sidecar.RegistrationName(r.reg.Pod)
	err := r.client.CoordinationV1().Leases(r.reg.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	switch {
	case err == nil:
		r.log.Info("registration deleted", "lease", r.reg.Namespace+"/"+name)
	case apierrors.IsNotFound(err):
	default:
		r.log.Warn("cannot delete the registration; it expires by itself", "lease", r.reg.Namespace+"/"+name, "expires", r.reg.Duration, "error", err)
	}
}
