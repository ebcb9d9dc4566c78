package provisioner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/services/provisioner/capacity"
)

// caPublishPeriod is how often the CA ConfigMap is checked.
const caPublishPeriod = 10 * time.Second

// sidecarTasks are the tasks of --discover-sidecars: the CA publisher
// and the discovery of registrations, which first loads the drivers etcd
// remembers. The readiness check "sidecar-discovery" passes once those
// are loaded and every registration has been listed, so no caller is
// told that a discovered driver is not volplane's before it is known.
func sidecarTasks(r *replica.Replica, o Options, reg *registry, capc *capacity.Controller) ([]replica.Task, error) {
	known := newKnownDrivers(r.Log, r.Coord, o.MemberID)
	connect := sidecarConnector(clientCertificate(o.TLS), func(driver, addr string) []grpc.UnaryClientInterceptor {
		d, _ := reg.sidecarDriver(driver)
		return []grpc.UnaryClientInterceptor{csiLogger(r.Log, "sidecar "+addr),
			connection.ExtendedCSIMetricsManager{CSIMetricsManager: d.metrics}.RecordMetricsClientInterceptor,
			capc.OnVolumeChange(func() string { return driver })}
	})
	disc, factory, err := newDiscovery(r.Log, r.Client, reg, known, connect)
	if err != nil {
		return nil, err
	}
	var ready atomic.Bool
	r.Health.AddReadiness("sidecar-discovery", replica.Condition(ready.Load, "the discovered CSI drivers are not loaded from etcd, or the sidecar registrations not listed, yet"))
	pub := &caPublisher{log: r.Log, client: r.Client, namespace: o.Namespace, file: o.TLS.CAFile, period: caPublishPeriod}
	run := func(ctx context.Context) {
		defer closeSidecars(reg)
		for err := known.load(ctx, reg); err != nil; err = known.load(ctx, reg) {
			r.Log.Warn("cannot load the discovered CSI drivers; trying again", "error", err)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
		}
		reg.kick()
		factory.Start(ctx.Done())
		defer factory.Shutdown()
		if !cache.WaitForCacheSync(ctx.Done(), disc.synced) {
			return
		}
		ready.Store(true)
		disc.run(ctx)
	}
	return []replica.Task{replica.Until(pub.run), replica.Until(run)}, nil
}

// closeSidecars closes the connections of every discovered driver.
func closeSidecars(reg *registry) {
	for _, d := range reg.all() {
		if d.sidecars != nil {
			d.sidecars.closeAll()
		}
	}
}

// clientCertificate reads the provisioner's certificate from its TLS
// files at each call (each handshake with a sidecar), so a rotated one is
// used; nil without files.
func clientCertificate(f grpcutil.TLSFiles) func() (*tls.Certificate, error) {
	if f.InsecurePlaintext || f.CertFile == "" {
		return nil
	}
	return func() (*tls.Certificate, error) {
		cfg, err := f.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("the provisioner's client certificate: %w", err)
		}
		if len(cfg.Certificates) == 0 {
			return nil, errors.New("the provisioner's TLS files hold no certificate")
		}
		return &cfg.Certificates[0], nil
	}
}

// validateDiscovery checks the driver options: a --csi-endpoint, or
// --discover-sidecars with the TLS files the sidecars require; it fills
// Namespace's default.
func (o *Options) validateDiscovery() []error {
	var errs []error
	if len(o.CSIEndpoints) == 0 && !o.DiscoverSidecars {
		errs = append(errs, errors.New("no CSI driver to provision with: name each driver's controller socket (--csi-endpoint [provisioner-name=]unix:///path/csi.sock or host:port), or find the drivers' volplane-csi-sidecars (--discover-sidecars)"))
	}
	if !o.DiscoverSidecars {
		return errs
	}
	if o.TLS.InsecurePlaintext {
		errs = append(errs, errors.New("--discover-sidecars needs the --tls-* files: a volplane-csi-sidecar accepts only the provisioner's client certificate, so --insecure-plaintext cannot reach one"))
	}
	if o.Namespace == "" {
		o.Namespace = os.Getenv("POD_NAMESPACE")
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if msgs := validation.IsDNS1123Label(o.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("namespace %q: %s (--namespace)", o.Namespace, strings.Join(msgs, "; ")))
	}
	return errs
}
