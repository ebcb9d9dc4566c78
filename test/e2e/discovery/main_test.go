// Package discovery tests the provisioner's discovery of CSI drivers
// served by volplane-csi-sidecars end to end: a real kube-apiserver (with
// RBAC, so the SubjectAccessReview is the real one) and etcd, the real
// provisioner (Run, in this process, with --discover-sidecars and no
// --csi-endpoint), and the dev CSI driver behind a small stand-in for the
// sidecar: a TLS 1.3 gRPC server with a self-signed certificate that
// requires volplane's provisioner's client certificate. The sidecar's
// pods are real Pod objects whose status the test sets (there is no
// kubelet), and their registrations real Leases.
package discovery

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/replica"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// cluster is what every test shares.
var cluster struct {
	e2e    *e2e.Cluster
	client kubernetes.Interface
	prov   provisionerv1.ProvisionerServiceClient
	// caFile is the CA the provisioner's client certificate chains to
	// (the sidecars' ClientCAs).
	caFile string
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/discovery: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := e2e.StartCluster(ctx, "e2e/discovery", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/discovery:", err)
		return 1
	}
	defer c.Stop()
	cluster.e2e, cluster.client, cluster.caFile = c, c.Client, c.TLS("provisioner").CAFile
	if err := setup(ctx, c.Client); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/discovery:", err)
		return 1
	}
	addr, err := devenv.FreeAddr()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	errc := make(chan error, 1)
	go func() { errc <- provisioner.Run(ctx, options(addr, "provisioner")) }()
	if err := c.WaitServing(ctx, addr, 2*time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/discovery: provisioner did not start:", err)
		c.DumpLogs(os.Stderr)
		return 1
	}
	cc, err := c.Dial(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cc.Close()
	cluster.prov = provisionerv1.NewProvisionerServiceClient(cc)
	return c.RunTests(m, "e2e/discovery", cancel, errc, 1)
}

// options are a provisioner replica's at addr, logging as name: sidecars
// discovered, no --csi-endpoint.
func options(addr, name string) provisioner.Options {
	c := cluster.e2e
	return provisioner.Options{
		Options: replica.Options{Kubeconfig: c.Kubeconfig, EtcdEndpoints: c.EtcdEndpoints, Listen: addr, TLS: c.TLS("provisioner"),
			Logger: c.Logger(name, slog.LevelDebug)},
		DiscoverSidecars: true,
		Namespace:        "volplane-system",
		Timeout:          2 * time.Second,
		RecoveryPeriod:   500 * time.Millisecond,
		ProbePeriod:      time.Second,
	}
}

// startProvisioner starts another provisioner replica for the rest of the
// test and returns a client of it.
func startProvisioner(t *testing.T) provisionerv1.ProvisionerServiceClient {
	t.Helper()
	addr, err := devenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- provisioner.Run(ctx, options(addr, "provisioner-2")) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the second provisioner: %v", err)
		}
	})
	if err := cluster.e2e.WaitServing(ctx, addr, time.Minute); err != nil {
		t.Fatal(err)
	}
	cc, err := cluster.e2e.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return provisionerv1.NewProvisionerServiceClient(cc)
}
