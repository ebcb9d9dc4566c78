// Package sidecar tests volplane-csi-sidecar end to end, as processes: a
// real kube-apiserver and etcd, the dev CSI driver's controller
// (volplane-csi --mode=controller) on a unix socket, and the sidecar
// binary in front of it, called with the provisioner's certificate as
// volplane's provisioner calls it.
package sidecar

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/sidecar"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// env is what every test shares.
var env struct {
	c       *e2e.Cluster
	client  kubernetes.Interface
	bin     string // the directory of volplane-csi and volplane-csi-sidecar
	csiSock string // the dev driver's socket
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/sidecar: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	c, err := e2e.StartCluster(ctx, "e2e/sidecar", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/sidecar:", err)
		return 1
	}
	defer c.Stop()
	env.c, env.client = c, c.Client
	env.bin = filepath.Join(c.Dir(), "bin")
	began := time.Now()
	build := exec.Command("go", "build", "-o", env.bin+"/", "github.com/volplane/volplane/cmd/volplane-csi", "github.com/volplane/volplane/cmd/volplane-csi-sidecar")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e/sidecar: go build: %v\n%s", err, out)
		return 1
	}
	fmt.Printf("e2e/sidecar: binaries built in %s\n", time.Since(began).Round(time.Millisecond))
	env.csiSock = filepath.Join(c.Dir(), "csi.sock")
	drv, err := devenv.StartProcess(c.Dir(), "volplane-csi", filepath.Join(env.bin, "volplane-csi"),
		"--mode=controller", "--endpoint=unix://"+env.csiSock, "--root-dir="+filepath.Join(c.Dir(), "csi-root"), "--node-id=node-a")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/sidecar:", err)
		return 1
	}
	defer drv.Stop()
	if err := publishCA(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/sidecar:", err)
		return 1
	}
	return m.Run()
}

// publishCA does what volplane's provisioner does: its CA in the
// ConfigMap the sidecars read.
func publishCA(ctx context.Context, c *e2e.Cluster) error {
	ca, err := os.ReadFile(c.CA.CertFile)
	if err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "volplane-system"}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "volplane-system", Name: sidecar.CAConfigMap},
		Data: map[string]string{sidecar.CAConfigMapKey: string(ca)}}
	_, err = c.Client.CoreV1().ConfigMaps("volplane-system").Create(ctx, cm, metav1.CreateOptions{})
	return err
}
