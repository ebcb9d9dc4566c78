package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Cluster is a running cluster the tests drive through kubectl (as a
// platform team would) and, where a typed answer is handier, client-go.
type Cluster struct {
	// Kubeconfig is the admin kubeconfig.
	Kubeconfig string
	// KubectlBin is the kubectl binary.
	KubectlBin string
	// Client is an admin client.
	Client kubernetes.Interface
	// WorkloadImage is the test workload's image
	// ($VOLPLANE_WORKLOAD_IMAGE; test/cluster/workload).
	WorkloadImage string

	// cacheDir is kubectl's discovery cache, the tests' own rather than
	// ~/.kube/cache.
	cacheDir string
}

// kubectlTimeout bounds one kubectl command.
const kubectlTimeout = 2 * time.Minute

// NewCluster checks that the cluster answers.
func NewCluster(kubeconfig, kubectl string) (*Cluster, error) {
	if kubectl == "" {
		kubectl = "kubectl"
	}
	path, err := exec.LookPath(kubectl)
	if err != nil {
		return nil, fmt.Errorf("kubectl: %w (set VOLPLANE_KUBECTL)", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	img := os.Getenv("VOLPLANE_WORKLOAD_IMAGE")
	if img == "" {
		img = "ghcr.io/volplane/workload:0.1.0"
	}
	cacheDir, err := os.MkdirTemp("", "volplane-cluster-kubectl-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Kubeconfig: kubeconfig, KubectlBin: path, Client: client, WorkloadImage: img, cacheDir: cacheDir}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Run(ctx, "", "version"); err != nil {
		c.Close()
		return nil, fmt.Errorf("the cluster does not answer: %w", err)
	}
	return c, nil
}

// Close removes what NewCluster made on the host.
func (c *Cluster) Close() error { return os.RemoveAll(c.cacheDir) }

// Run runs kubectl with the cluster's kubeconfig, stdin as its input,
// and returns its standard output; the error carries its standard error.
func (c *Cluster) Run(ctx context.Context, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, kubectlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.KubectlBin, append([]string{"--kubeconfig", c.Kubeconfig, "--cache-dir", c.cacheDir}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Kubectl runs kubectl and fails the test when it fails.
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.Run(t.Context(), "", args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Apply applies the manifest in namespace ns ("" for the manifest's own).
func (c *Cluster) Apply(t testing.TB, ns, manifest string) {
	t.Helper()
	args := []string{"apply", "-f", "-"}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	if _, err := c.Run(t.Context(), manifest, args...); err != nil {
		t.Fatal(err)
	}
}

// Exec runs a command in a pod's (first) container and returns its output.
func (c *Cluster) Exec(t testing.TB, ns, pod string, command ...string) string {
	t.Helper()
	return c.Kubectl(t, append([]string{"exec", "-n", ns, pod, "--"}, command...)...)
}

// Logs returns a pod's (first) container's log.
func (c *Cluster) Logs(t testing.TB, ns, pod string) string {
	t.Helper()
	return c.Kubectl(t, "logs", "-n", ns, pod)
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// Namespace creates a namespace for the test and deletes it when the test
// ends, after logging what was in it if the test failed.
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	base := strings.Trim(nonName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 40 {
		base = base[:40]
	}
	name := base + "-" + randomSuffix()
	c.Kubectl(t, "create", "namespace", name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if t.Failed() {
			for _, args := range [][]string{
				{"get", "all,events", "-n", name, "-o", "wide"},
				{"describe", "pods", "-n", name},
			} {
				out, err := c.Run(ctx, "", args...)
				t.Logf("kubectl %s:\n%s%v", strings.Join(args, " "), out, errOrEmpty(err))
			}
		}
		// A namespace of many pods and claims (the fault test's: each
		// claim's volume deleted by the reclaimer) takes minutes to go:
		// longer than one kubectl command may last.
		if _, err := c.Run(ctx, "", "delete", "namespace", name, "--wait=false"); err != nil {
			t.Errorf("deleting the test's namespace: %v", err)
			return
		}
		for {
			_, err := c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return
			}
			select {
			case <-ctx.Done():
				t.Errorf("the test's namespace %s is not gone after 10m: %v", name, err)
				return
			case <-time.After(time.Second):
			}
		}
	})
	return name
}

func errOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func randomSuffix() string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// waitFor polls cond every half second until it returns "" and fails the
// test with cond's last answer (what it is still waiting for) after
// timeout.
func waitFor(t testing.TB, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, why)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%v: %s", t.Context().Err(), why)
		case <-tick.C:
		}
	}
}

// holds polls cond every half second for d and fails the test as soon as
// it returns something other than "" (what went wrong).
func holds(t testing.TB, d time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		if why := cond(); why != "" {
			t.Fatal(why)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-tick.C:
		}
	}
}

// WaitPodReady waits until the pod's containers are all ready and returns
// on a container that cannot start (an image the runtime does not have, a
// crash loop) at once, with the reason.
func (c *Cluster) WaitPodReady(t testing.TB, ns, pod string, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, func() string {
		out, err := c.Run(t.Context(), "", "get", "pod", "-n", ns, pod, "-o",
			`jsonpath={.status.phase}{" ready="}{.status.conditions[?(@.type=="Ready")].status}{" "}{.status.containerStatuses[*].state.waiting.reason}`)
		if err != nil {
			return err.Error()
		}
		if strings.Contains(out, "ready=True") {
			return ""
		}
		for _, fatal := range []string{"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff", "CreateContainerConfigError"} {
			if strings.Contains(out, fatal) {
				t.Fatalf("pod %s/%s cannot start: %s", ns, pod, out)
			}
		}
		return fmt.Sprintf("pod %s/%s: %s", ns, pod, out)
	})
}
