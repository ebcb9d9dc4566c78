// Command volplane-dev runs the whole of volplane on this machine: an
// embedded etcd, a real kube-apiserver, the dev CSI driver (volplane-csi),
// the watcher, binder, provisioner and reclaimer services and the REST
// gateway, all on loopback. The services talk mutual TLS with certificates
// it generates (<dir>/tls); the gateway serves HTTPS and authenticates its
// callers against the apiserver, and volplane-dev mints a token for a
// ServiceAccount bound to the volplane-operator ClusterRole
// (<dir>/gateway-token). It prints the kubeconfig path, the gateway URL and
// curl lines that use the token, and runs until Ctrl-C, then stops
// everything in order. It publishes the gateway's URL and CA on the Service
// volplane-system/volplane-gateway, where kubectl-volplane finds them.
// `make up` runs it.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/pki"
)

const description = `volplane-dev runs etcd, kube-apiserver and every volplane service (watcher,
binder, provisioner, reclaimer, gateway and the dev CSI driver) as processes on loopback, with
their certificates and a kubeconfig in --dir, until Ctrl-C: what make up runs. With
--write-compose it only writes what docker-compose.yaml mounts.`

func main() {
	cmd := cmdutil.NewCommand("volplane-dev", description)
	fs := cmd.Flags("Development environment")
	var (
		binDir       = fs.String("bin-dir", "", "directory holding the service binaries (make build); default: this binary's directory")
		apiserver    = fs.String("kube-apiserver", "", "kube-apiserver binary; default: the cached build (make kube-apiserver)")
		dir          = fs.String("dir", filepath.Join(".cache", "dev"), "state directory (etcd data, certificates, kubeconfig, logs); wiped at start")
		gatewayURL   = fs.String("gateway-listen", "127.0.0.1:8080", "the REST gateway's listen address")
		workers      = fs.Int("workers", 0, "binder --workers; 0 keeps the binder's default")
		logLevel     = fs.String("log-level", "info", "services' log level: debug, info, warn or error")
		roles        = fs.String("roles", filepath.Join("deploy", "kubernetes", "roles.yaml"), "ClusterRoles to apply (volplane-viewer, volplane-operator); when the file is missing, the same two roles are made in code")
		driverFaults []string
		writeCompose = fs.String("write-compose", "", "only write what docker-compose.yaml mounts into this directory (a CA, a certificate for etcd, kube-apiserver and each service, the service-account keys, an admin token and the services' kubeconfig), then exit")
	)
	cmdutil.ListFlag(fs, &driverFaults, "driver-fault", "a fault for the dev CSI driver, METHOD=ACTION (its --fault), e.g. CreateVolume=delay:3s to watch a slow provisioning in `kubectl volplane timeline`; repeatable")
	if code, done := cmd.Parse(os.Args[1:]); done {
		os.Exit(code)
	}
	if err := cmd.NoArgs(); err != nil {
		os.Exit(cmd.UsageError(err))
	}
	if *writeCompose != "" {
		if err := writeComposeFiles(*writeCompose); err != nil {
			fmt.Fprintln(os.Stderr, "volplane-dev:", err)
			os.Exit(1)
		}
		fmt.Println("docker-compose.yaml's certificates, keys, token and kubeconfig written to", *writeCompose)
		return
	}
	if *binDir == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, "volplane-dev: --bin-dir is required:", err)
			os.Exit(2)
		}
		*binDir = filepath.Dir(exe)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, devOptions{binDir: *binDir, apiserver: *apiserver, dir: *dir, gatewayListen: *gatewayURL, workers: *workers,
		logLevel: *logLevel, roles: *roles, driverFaults: driverFaults}); err != nil {
		fmt.Fprintln(os.Stderr, "volplane-dev:", err)
		os.Exit(1)
	}
}

// devUser names the user of the client certificate volplane-dev prints
// for the gateway (a volplane-viewer), signed by the users' CA: not a
// certificate of the services' CA, which would be a service credential.
const devUser = "volplane-dev"

type service struct {
	name string
	// bin is the binary (and certificate) name when it differs from name
	// (a second replica).
	bin  string
	addr string
	args []string
	p    *devenv.Process
}

// binary is the service's binary and certificate name.
func (s *service) binary() string {
	if s.bin != "" {
		return s.bin
	}
	return s.name
}

// devOptions are volplane-dev's flags.
type devOptions struct {
	binDir, apiserver, dir, gatewayListen string
	workers                               int
	logLevel, roles                       string
	driverFaults                          []string
}

func run(ctx context.Context, o devOptions) error {
	binDir, apiserver, gatewayListen, workers, logLevel, roles := o.binDir, o.apiserver, o.gatewayListen, o.workers, o.logLevel, o.roles
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	// A fresh cluster every time: stale etcd data from a crashed run
	// would only confuse.
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fmt.Println("starting etcd and kube-apiserver...")
	env, err := devenv.Start(ctx, devenv.Options{Dir: dir, KubeAPIServer: apiserver})
	if err != nil {
		return err
	}
	defer env.Stop()

	// Mutual TLS between the services: a CA and a certificate per
	// service. Users' client certificates for the gateway come from a CA
	// of their own (<dir>/tls/users), as in deploy/.
	tlsDir := filepath.Join(dir, "tls")
	certs, err := pki.Generate(tlsDir, pki.Services...)
	if err != nil {
		return fmt.Errorf("generate certificates: %w", err)
	}
	users, err := pki.NewCA(filepath.Join(tlsDir, "users"), "volplane-dev-users-ca")
	if err != nil {
		return fmt.Errorf("generate the users' CA: %w", err)
	}
	viewerCert, err := users.IssueUser(devUser)
	if err != nil {
		return fmt.Errorf("generate the viewer's certificate: %w", err)
	}
	tokenPath := filepath.Join(dir, "gateway-token")
	if err := gatewayCredential(ctx, env, roles, tokenPath, devUser); err != nil {
		return err
	}

	nodeID, herr := os.Hostname()
	if herr != nil || nodeID == "" {
		nodeID = devcsi.DefaultNodeID
	}
	// No kubelet registers the dev driver on this node: do it as it would.
	if err := devcsi.RegisterNode(ctx, kubernetes.NewForConfigOrDie(env.RESTConfig), devcsi.DefaultName, nodeID); err != nil {
		return err
	}

	etcd := strings.Join(env.EtcdEndpoints, ",")
	kc := env.Kubeconfig
	addr := func() string {
		if err != nil {
			return ""
		}
		var a string
		a, err = devenv.FreeAddr()
		return a
	}
	// Two watchers: the binder streams from one and fails over to the
	// other (stop one to see it).
	watcher, watcher2, provisioner, reclaimer, binder := addr(), addr(), addr(), addr(), addr()
	if err != nil {
		return err
	}
	common := []string{"--log-level", logLevel}
	// The dev CSI driver the provisioner provisions through: volumes are
	// directories under <dir>/csi/root.
	csiEndpoint := "unix://" + filepath.Join(dir, "csi", "csi.sock")
	hostPaths := filepath.Join(dir, "hostpath")
	if err := os.MkdirAll(hostPaths, 0o755); err != nil {
		return err
	}
	services := []*service{
		{name: "volplane-csi", addr: csiEndpoint, args: []string{"--endpoint", csiEndpoint,
			"--root-dir", filepath.Join(dir, "csi", "root"), "--node-id", nodeID,
			// 100 GiB on the one node: GetCapacity reports what is left.
			"--node-capacity", strconv.FormatInt(100<<30, 10)}},
		{name: "watcher", addr: watcher, args: []string{"--kubeconfig", kc, "--listen", watcher}},
		{name: "watcher-2", bin: "watcher", addr: watcher2, args: []string{"--kubeconfig", kc, "--listen", watcher2}},
		// The gateway serves HTTPS with its service certificate, checks
		// bearer tokens and SubjectAccessReviews with the apiserver, and
		// accepts client certificates of the users' CA.
		// Capacity tracking publishes CSIStorageCapacity objects (also for
		// Immediate classes, so the demo's class "fast" has one).
		{name: "provisioner", addr: provisioner, args: []string{"--kubeconfig", kc, "--etcd-endpoints", etcd, "--listen", provisioner,
			"--csi-endpoint", csiEndpoint, "--enable-capacity", "--capacity-namespace", "volplane-system", "--capacity-for-immediate-binding",
			"--watcher-address", watcher + "," + watcher2}},
		// No kubelet runs recycler pods here: the reclaimer scrubs hostPath
		// volumes of Recycle policy itself, on this machine, and only
		// under <dir>/hostpath.
		{name: "reclaimer", addr: reclaimer, args: []string{"--kubeconfig", kc, "--etcd-endpoints", etcd, "--listen", reclaimer,
			"--provisioner-address", provisioner, "--recycle-mode", "node-local", "--node-name", nodeID,
			"--recycle-path-prefixes", hostPaths}},
		{name: "binder", addr: binder, args: []string{"--kubeconfig", kc, "--etcd-endpoints", etcd, "--listen", binder,
			"--watcher-address", watcher + "," + watcher2, "--reclaimer-address", reclaimer, "--provisioner-address", provisioner,
			"--workers", strconv.Itoa(workers)}},
		{name: "gateway", args: []string{"--listen", gatewayListen, "--watcher-address", watcher, "--binder-address", binder,
			"--provisioner-address", provisioner, "--reclaimer-address", reclaimer, "--kubeconfig", kc,
			"--client-ca-file", users.CertFile,
			"--tls-serving-cert-file", certs["gateway"].CertFile, "--tls-serving-key-file", certs["gateway"].KeyFile}},
	}
	for _, f := range o.driverFaults {
		services[0].args = append(services[0].args, "--fault", f)
	}
	for _, s := range services {
		if f, ok := certs[s.binary()]; ok {
			s.args = append(s.args, devenv.TLSArgs(f)...)
		}
	}
	byName := func(name string) *service {
		return services[slices.IndexFunc(services, func(s *service) bool { return s.name == name })]
	}
	if workers == 0 {
		b := byName("binder")
		b.args = slices.Delete(b.args, slices.Index(b.args, "--workers"), slices.Index(b.args, "--workers")+2)
	}
	defer func() {
		// Stop in reverse order: the gateway first, the CSI driver last.
		for i := len(services) - 1; i >= 0; i-- {
			if s := services[i]; s.p != nil {
				s.p.Stop()
			}
		}
	}()
	for _, s := range services {
		s.p, err = devenv.StartProcess(dir, s.name, filepath.Join(binDir, s.binary()), append(s.args, common...)...)
		if err != nil {
			return err
		}
		// The health service is open to every certificate of the
		// services' CA: the gateway's will do.
		wait := func() error { return devenv.WaitServing(ctx, s.addr, "", certs["gateway"], 2*time.Minute) }
		if s.name == "volplane-csi" {
			wait = func() error { return devenv.WaitCSIServing(ctx, s.addr, 2*time.Minute) }
		}
		if s.addr != "" {
			if err := wait(); err != nil {
				return fmt.Errorf("%s did not become ready: %w (log: %s)", s.name, err, s.p.LogPath)
			}
		}
	}
	if err := waitHTTP(ctx, "https://"+gatewayListen+"/readyz", certs["gateway"].CAFile, time.Minute); err != nil {
		return fmt.Errorf("gateway: %w (log: %s)", err, byName("gateway").p.LogPath)
	}
	if err := publishGateway(ctx, env, "https://"+gatewayListen, certs["gateway"].CAFile); err != nil {
		return err
	}

	absBin, aerr := filepath.Abs(binDir)
	if aerr != nil {
		absBin = binDir
	}
	fmt.Printf(`
volplane is up.

  kubeconfig:  %[1]s
  gateway:     https://%[2]s   (OpenAPI: https://%[2]s/openapi.json)
  CA:          %[4]s   (signs the gateway's and the services' certificates)
  users' CA:   %[10]s   (signs users' client certificates for the gateway)
  token:       %[5]s   (ServiceAccount default/volplane-admin, ClusterRole volplane-operator, valid 24h)
  logs:        %[3]s/*.log
  hostPath:    %[3]s/hostpath   (the only place Recycle scrubs hostPath volumes)

Try:
  export KUBECONFIG=%[1]s
  kubectl apply -f deploy/examples/static-binding.yaml
  kubectl apply -f deploy/examples/dynamic-provisioning.yaml
  kubectl get pv,pvc
  curl -s --cacert %[4]s -H "Authorization: Bearer $(cat %[5]s)" https://%[2]s/v1/namespaces/default/claims/demo-claim
  curl -s --cacert %[4]s -H "Authorization: Bearer $(cat %[5]s)" https://%[2]s/v1/drivers

The kubectl plugin finds the gateway by the Service volplane-system/volplane-gateway (docs/kubectl-plugin.md):
  export PATH=%[9]s:$PATH
  kubectl volplane claims -A
  kubectl volplane drivers

A client certificate of the users' CA authenticates too (its CN is the user, here %[8]s, a volplane-viewer;
the services accept only their own certificates, each for the calls its service makes):
  curl -s --cacert %[4]s --cert %[6]s --key %[7]s https://%[2]s/v1/drivers

Ctrl-C stops everything.
`, kc, gatewayListen, dir, certs["gateway"].CAFile, tokenPath, viewerCert.CertFile, viewerCert.KeyFile, devUser, absBin, users.CertFile)

	exited := make(chan *service, len(services))
	for _, s := range services {
		go func() {
			<-s.p.Done()
			exited <- s
		}()
	}
	select {
	case <-ctx.Done():
		fmt.Println("\nstopping...")
		return nil
	case s := <-exited:
		return fmt.Errorf("%s exited unexpectedly (%s); see %s", s.name, s.p.ExitStatus(), s.p.LogPath)
	case <-env.Exited():
		return errors.New("kube-apiserver exited unexpectedly; see " + env.APIServerLog)
	}
}

// waitHTTP polls url until it answers 200, verifying the server against
// the CA in caFile.
func waitHTTP(ctx context.Context, url, caFile string, timeout time.Duration) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("%s holds no PEM certificate", caFile)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready within %s: %s", url, timeout, last)
}
