// Command volplane-dev runs the whole of volplane on this machine: an
// embedded etcd, a real kube-apiserver, the dev CSI driver (volplane-csi),
// the watcher, binder, provisioner and reclaimer services and the REST
// gateway, all on loopback. It prints the kubeconfig path and the gateway
// URL and runs until Ctrl-C, then stops everything in order. `make up` runs
// it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/volplane/volplane/internal/devenv"
)

func main() {
	var (
		binDir     = flag.String("bin-dir", "", "directory holding the service binaries (make build); default: this binary's directory")
		apiserver  = flag.String("kube-apiserver", "", "kube-apiserver binary; default: the cached build (make kube-apiserver)")
		dir        = flag.String("dir", filepath.Join(".cache", "dev"), "state directory (etcd data, certificates, kubeconfig, logs); wiped at start")
		gatewayURL = flag.String("gateway-listen", "127.0.0.1:8080", "the REST gateway's listen address")
		workers    = flag.Int("workers", 0, "binder --workers; 0 keeps the binder's default")
		logLevel   = flag.String("log-level", "info", "services' log level: debug, info, warn or error")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: %s [flags]\n\nRuns etcd, kube-apiserver and every volplane service on loopback until Ctrl-C.\n\nFlags:\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "volplane-dev: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
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
	if err := run(ctx, *binDir, *apiserver, *dir, *gatewayURL, *workers, *logLevel); err != nil {
		fmt.Fprintln(os.Stderr, "volplane-dev:", err)
		os.Exit(1)
	}
}

type service struct {
	name string
	addr string
	args []string
	p    *devenv.Process
}

func run(ctx context.Context, binDir, apiserver, dir, gatewayListen string, workers int, logLevel string) error {
	dir, err := filepath.Abs(dir)
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
	watcher, provisioner, reclaimer, binder := addr(), addr(), addr(), addr()
	if err != nil {
		return err
	}
	common := []string{"--log-level", logLevel}
	// The dev CSI driver the provisioner provisions through: volumes are
	// directories under <dir>/csi/root.
	csiEndpoint := "unix://" + filepath.Join(dir, "csi", "csi.sock")
	nodeID, herr := os.Hostname()
	if herr != nil || nodeID == "" {
		nodeID = "volplane-dev-node"
	}
	services := []*service{
		{name: "volplane-csi", addr: csiEndpoint, args: []string{"--endpoint", csiEndpoint,
			"--root-dir", filepath.Join(dir, "csi", "root"), "--node-id", nodeID}},
		{name: "watcher", addr: watcher, args: []string{"--kubeconfig", kc, "--listen", watcher}},
		{name: "provisioner", addr: provisioner, args: []string{"--kubeconfig", kc, "--etcd-endpoints", etcd, "--listen", provisioner,
			"--csi-endpoint", csiEndpoint}},
		// No kubelet runs recycler pods here: the reclaimer scrubs hostPath
		// volumes of Recycle policy itself, on this machine.
		{name: "reclaimer", addr: reclaimer, args: []string{"--kubeconfig", kc, "--etcd-endpoints", etcd, "--listen", reclaimer,
			"--provisioner-address", provisioner, "--recycle-mode", "node-local", "--node-name", nodeID}},
		{name: "binder", addr: binder, args: []string{"--kubeconfig", kc, "--etcd-endpoints", etcd, "--listen", binder,
			"--watcher-address", watcher, "--reclaimer-address", reclaimer, "--provisioner-address", provisioner,
			"--workers", strconv.Itoa(workers)}},
		{name: "gateway", args: []string{"--listen", gatewayListen, "--watcher-address", watcher, "--binder-address", binder,
			"--provisioner-address", provisioner, "--reclaimer-address", reclaimer}},
	}
	if workers == 0 {
		services[4].args = services[4].args[:len(services[4].args)-2]
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
		s.p, err = devenv.StartProcess(dir, s.name, filepath.Join(binDir, s.name), append(s.args, common...)...)
		if err != nil {
			return err
		}
		if s.addr != "" {
			if err := devenv.WaitServing(ctx, s.addr, "", 2*time.Minute); err != nil {
				return fmt.Errorf("%s did not become ready: %w (log: %s)", s.name, err, s.p.LogPath)
			}
		}
	}
	if err := waitHTTP(ctx, "http://"+gatewayListen+"/readyz", time.Minute); err != nil {
		return fmt.Errorf("gateway: %w (log: %s)", err, services[5].p.LogPath)
	}

	fmt.Printf(`
volplane is up.

  kubeconfig:  %s
  gateway:     http://%s   (OpenAPI: http://%[2]s/openapi.json)
  logs:        %s/*.log

Try:
  export KUBECONFIG=%[1]s
  kubectl apply -f deploy/examples/static-binding.yaml
  kubectl apply -f deploy/examples/dynamic-provisioning.yaml
  kubectl get pv,pvc
  curl -s http://%[2]s/v1/namespaces/default/claims/demo-claim
  curl -s http://%[2]s/v1/drivers

Ctrl-C stops everything.
`, kc, gatewayListen, dir)

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

func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
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
