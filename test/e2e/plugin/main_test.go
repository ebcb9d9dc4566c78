// Package plugin tests the list APIs' paging through the REST gateway and
// the kubectl plugin (internal/kubectlplugin) end to end: a real
// kube-apiserver and etcd, every volplane service and the gateway (HTTPS,
// TokenReview, SubjectAccessReview, client certificates), and volplane's
// dev CSI driver, all in this process; the plugin authenticates with real
// ServiceAccount tokens and a client certificate from a kubeconfig.
package plugin

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// cluster is what every test shares.
var cluster struct {
	env    *devenv.Env
	client kubernetes.Interface
	e2e    *e2e.Cluster
	driver *devcsi.Driver
	csi    csi.ControllerClient
	// gatewayURL is https://127.0.0.1:port; gatewayCA signs its serving
	// certificate; clientCA signs the client certificates it accepts.
	gatewayURL, gatewayCA, clientCA string
	// http calls the gateway, trusting gatewayCA.
	http *http.Client
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/plugin: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := e2e.StartCluster(ctx, "e2e/plugin", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/plugin:", err)
		return 1
	}
	defer c.Stop()
	env, dir := c.Env, c.Dir()
	cluster.env, cluster.client, cluster.e2e = env, c.Client, c
	logger := func(name string) *slog.Logger { return c.Logger(name, slog.LevelInfo) }

	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(dir, "csi"), NodeID: "node-a", Logger: logger("csi")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/plugin: dev CSI driver:", err)
		return 1
	}
	// The node a kubelet would register for the driver: its topology is
	// what the provisioner offers CreateVolume, as external-provisioner.
	if err := devcsi.RegisterNode(ctx, c.Client, drv.Name(), drv.NodeID()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/plugin:", err)
		return 1
	}
	cluster.driver = drv
	sock := "unix://" + filepath.Join(dir, "csi.sock")
	lis, err := grpcutil.Listen(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	csiSrv := grpcutil.NewCSIServer(logger("csi"), grpc.ChainUnaryInterceptor(drv.Faults().UnaryServerInterceptor()))
	drv.Register(csiSrv.Server)
	csiSrv.SetServing(true)
	csiConn, err := grpcutil.DialCSI(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer csiConn.Close()
	cluster.csi = csi.NewControllerClient(csiConn)

	addr := func() string {
		a, err := devenv.FreeAddr()
		if err != nil {
			panic(err)
		}
		return a
	}
	watcherAddr, provisionerAddr, reclaimerAddr, binderAddr, gatewayAddr := addr(), addr(), addr(), addr(), addr()
	errc := make(chan error, 6)
	go func() { errc <- csiSrv.Serve(ctx, lis, 10*time.Second) }()
	go func() {
		errc <- watcher.Run(ctx, watcher.Options{Kubeconfig: env.Kubeconfig, Listen: watcherAddr, TLS: c.TLS("watcher"), Logger: logger("watcher")})
	}()
	go func() {
		errc <- provisioner.Run(ctx, provisioner.Options{
			Options:        replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: provisionerAddr, TLS: c.TLS("provisioner"), Logger: logger("provisioner")},
			CSIEndpoints:   []string{sock},
			WatcherAddress: watcherAddr,
			Timeout:        2 * time.Second,
			RecoveryPeriod: 500 * time.Millisecond,
		})
	}()
	go func() {
		errc <- reclaimer.Run(ctx, reclaimer.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: reclaimerAddr, TLS: c.TLS("reclaimer"), Logger: logger("reclaimer")},
			ProvisionerAddress: provisionerAddr,
			// A failed reclaim waits for `reclaim retry` (write_test.go):
			// nothing retries it meanwhile.
			RetryIntervalStart: 10 * time.Minute,
			RetryIntervalMax:   20 * time.Minute,
		})
	}()
	go func() {
		errc <- binder.Run(ctx, binder.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: binderAddr, TLS: c.TLS("binder"), Logger: logger("binder")},
			WatcherAddress:     watcherAddr,
			ReclaimerAddress:   reclaimerAddr,
			ProvisionerAddress: provisionerAddr,
		})
	}()
	// The gateway as deployed: HTTPS with its service certificate,
	// TokenReview and SubjectAccessReview against the API server, client
	// certificates of the users' CA (not the services').
	gw := c.TLS("gateway")
	go func() {
		errc <- gateway.Run(ctx, gateway.Options{Listen: gatewayAddr, WatcherAddress: watcherAddr, BinderAddress: binderAddr,
			ProvisionerAddress: provisionerAddr, ReclaimerAddress: reclaimerAddr, TLS: gw,
			Auth:   gateway.AuthOptions{RESTConfig: env.RESTConfig, ClientCAFile: c.UserCA.CertFile},
			HTTP:   gateway.HTTPOptions{TLSCertFile: gw.CertFile, TLSKeyFile: gw.KeyFile},
			Logger: logger("gateway")})
	}()
	cluster.gatewayURL, cluster.gatewayCA, cluster.clientCA = "https://"+gatewayAddr, gw.CAFile, c.UserCA.CertFile
	pem, err := os.ReadFile(gw.CAFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	cluster.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	if err := waitReady(ctx, errc); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/plugin: services did not start:", err)
		c.DumpLogs(os.Stderr)
		return 1
	}
	return c.RunTests(m, "e2e/plugin", cancel, errc, 6)
}

// waitReady waits until the gateway's /readyz says every backend serves
// (no backend is unavailable).
func waitReady(ctx context.Context, errc <-chan error) error {
	deadline := time.Now().Add(2 * time.Minute)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case err := <-errc:
			return fmt.Errorf("a service stopped: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		resp, err := cluster.http.Get(cluster.gatewayURL + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			// The gateway is ready as soon as it can authenticate; its
			// body says which backends are not serving yet.
			var body struct{ Unavailable []string }
			if resp.StatusCode == http.StatusOK && json.Unmarshal(b, &body) == nil && len(body.Unavailable) == 0 {
				return nil
			}
			last = string(b)
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("gateway not ready within 2m: %s", last)
}
