package replicas

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/internal/devenv"
	"github.com/volplane/volplane/internal/e2e"
	"github.com/volplane/volplane/internal/manifests"
	"github.com/volplane/volplane/internal/pki"
)

// renderedNamespace is the namespace deploy/kubernetes puts everything in.
const renderedNamespace = "volplane-system"

// The manifests' wiring, flags and RBAC, proven without a kubelet: every
// volplane container of the dev overlay, rendered as kubectl kustomize
// renders it, runs as a local process with its command and arguments as
// rendered and the rights of its pod's ServiceAccount (an admin
// kubeconfig that impersonates it, through KUBECONFIG, where the pod would
// have its in-cluster token). Only what a node provides is translated:
// the Services' names and container ports become loopback addresses (free
// ports), the mounted volumes local directories (the certificate Secrets
// written by a CA of the test, as cert-manager would), and $(VAR) the
// values of the containers' downward-API variables. etcd is one of the
// test's own, serving with the same CA (the StatefulSet's etcd image is
// not a volplane binary). Then a bind, a provisioning and a reclaim go
// through them.
func TestRenderedContainersRunAsShipped(t *testing.T) {
	applyRBAC(t)
	_, objs, err := manifests.Render(filepath.Join("..", "..", "..", "deploy", "overlays", "dev"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	bin := filepath.Join(root, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "github.com/volplane/volplane/services/watcher/cmd/watcher",
		"github.com/volplane/volplane/services/binder/cmd/binder", "github.com/volplane/volplane/services/provisioner/cmd/provisioner",
		"github.com/volplane/volplane/services/reclaimer/cmd/reclaimer", "github.com/volplane/volplane/gateway/cmd/gateway",
		"github.com/volplane/volplane/cmd/volplane-csi")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the services: %v\n%s", err, out)
	}
	ca, err := pki.NewCA(filepath.Join(root, "ca"), "volplane-as-rendered-ca")
	if err != nil {
		t.Fatal(err)
	}
	users, err := pki.NewCA(filepath.Join(root, "users-ca"), "volplane-as-rendered-users-ca")
	if err != nil {
		t.Fatal(err)
	}
	etcdCert, err := ca.Issue("volplane-etcd")
	if err != nil {
		t.Fatal(err)
	}
	etcd, err := devenv.StartEtcdTLS(filepath.Join(root, "etcd"), &devenv.EtcdTLS{CAFile: ca.CertFile, CertFile: etcdCert.CertFile, KeyFile: etcdCert.KeyFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Stop)

	// Each Service port becomes a free loopback port; which service a
	// port is, the manifests say (7701 the watcher, ..., 2379 etcd).
	ports := map[string]string{"2379": strings.TrimPrefix(etcd.Endpoints[0], "https://127.0.0.1:")}
	for _, p := range []string{"7701", "7702", "7703", "7704", "8443"} {
		addr, err := devenv.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		ports[p] = strings.TrimPrefix(addr, "127.0.0.1:")
	}
	admin, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}

	var procs []*devenv.Process
	t.Cleanup(func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].Stop()
		}
		if t.Failed() {
			for _, p := range procs {
				b, _ := os.ReadFile(p.LogPath)
				t.Logf("%s's log (%s):\n%s", p.Name, p.ExitStatus(), tailOf(string(b), 3000))
			}
		}
	})
	// start runs every container of one pod of a workload.
	start := func(workload string, pod corev1.PodSpec, podName string) {
		dir := filepath.Join(root, podName)
		vars := map[string]string{}
		volumes := map[string]string{}
		for _, v := range pod.Volumes {
			d := filepath.Join(dir, "volumes", v.Name)
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
			switch {
			case v.Secret != nil && v.Secret.SecretName == "volplane-gateway-client-ca":
				// The CA of the users' client certificates: not the
				// services' (the gateway refuses that).
				copyFile(t, users.CertFile, filepath.Join(d, "ca.crt"))
			case v.Secret != nil:
				// A cert-manager Certificate's Secret: ca.crt, tls.crt, tls.key.
				writeSecret(t, ca, d, workload)
			}
			volumes[v.Name] = d
		}
		kubeconfig := impersonating(t, admin, filepath.Join(dir, "kubeconfig"), "system:serviceaccount:"+renderedNamespace+":"+pod.ServiceAccountName)
		for _, c := range pod.Containers {
			env := []string{"KUBECONFIG=" + kubeconfig}
			for _, e := range c.Env {
				val := e.Value
				if f := e.ValueFrom; f != nil && f.FieldRef != nil {
					switch f.FieldRef.FieldPath {
					case "metadata.name":
						val = podName
					case "metadata.namespace":
						val = renderedNamespace
					case "spec.nodeName":
						val = devcsi.DefaultNodeID
					default:
						t.Fatalf("%s/%s: no local value for the downward API field %s", podName, c.Name, f.FieldRef.FieldPath)
					}
				}
				vars[e.Name] = val
				env = append(env, e.Name+"="+val)
			}
			args := append(append([]string{}, c.Command...), c.Args...)
			for i, a := range args {
				args[i] = localize(t, a, vars, c.VolumeMounts, volumes, ports)
			}
			bin := filepath.Join(bin, filepath.Base(args[0]))
			p, err := devenv.StartProcessEnv(dir, c.Name, bin, env, args[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			procs = append(procs, p)
			t.Logf("%s/%s: %s %s", podName, c.Name, filepath.Base(args[0]), strings.Join(args[1:], " "))
		}
	}

	// What a kubelet would do for the dev driver: its Node and CSINode.
	ctx := context.Background()
	if err := devcsi.RegisterNode(ctx, client, "hostpath.csi.volplane.io", devcsi.DefaultNodeID); err != nil {
		t.Fatal(err)
	}
	started := map[string]bool{}
	for _, o := range objs {
		var spec corev1.PodSpec
		switch o.GetKind() {
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				t.Fatal(err)
			}
			spec = d.Spec.Template.Spec
		case "StatefulSet":
			var s appsv1.StatefulSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &s); err != nil {
				t.Fatal(err)
			}
			spec = s.Spec.Template.Spec
		default:
			continue
		}
		if o.GetName() == "volplane-etcd" {
			continue // the test's own etcd stands in
		}
		podName := o.GetName() + "-0"
		start(o.GetName(), spec, podName)
		started[o.GetName()] = true
	}
	for _, w := range []string{"volplane-watcher", "volplane-binder", "volplane-provisioner", "volplane-reclaimer", "volplane-gateway"} {
		if !started[w] {
			t.Fatalf("the rendered manifests have no %s", w)
		}
	}

	// A bind, a provisioning, a reclaim.
	immediate := storagev1.VolumeBindingImmediate
	e2e.CreateClass(t, client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "as-rendered-static"},
		Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &immediate})
	e2e.CreateClass(t, client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "as-rendered-dynamic"},
		Provisioner: "hostpath.csi.volplane.io", VolumeBindingMode: &immediate})
	pv := e2e.Volume("as-rendered-pv", "1Gi", "as-rendered-static")
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := e2e.Namespace(t, client)
	for _, c := range []*corev1.PersistentVolumeClaim{
		e2e.Claim(ns, "static", "1Gi", "as-rendered-static"),
		e2e.Claim(ns, "dynamic", "1Gi", "as-rendered-dynamic"),
	} {
		if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := e2e.ClaimPhase(t, client, ns, "static", corev1.ClaimBound, 2*time.Minute); got.Spec.VolumeName != pv.Name {
		t.Fatalf("claim static bound to %q, want %s", got.Spec.VolumeName, pv.Name)
	}
	dynamic := e2e.ClaimPhase(t, client, ns, "dynamic", corev1.ClaimBound, 2*time.Minute)
	provisioned, err := client.CoreV1().PersistentVolumes().Get(ctx, dynamic.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if provisioned.Spec.CSI == nil || provisioned.Spec.CSI.Driver != "hostpath.csi.volplane.io" {
		t.Fatalf("claim dynamic bound to %s, not a volume of the dev CSI driver", provisioned.Name)
	}
	// The gateway, as its ServiceAccount: TokenReview and
	// SubjectAccessReview for the caller, then the binder.
	caPEM, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	e2e.Eventually(t, time.Minute, func() string {
		req, _ := http.NewRequest(http.MethodGet, "https://127.0.0.1:"+ports["8443"]+"/v1/namespaces/"+ns+"/claims/static", nil)
		req.Header.Set("Authorization", "Bearer "+env.RESTConfig.BearerToken)
		resp, err := hc.Do(req)
		if err != nil {
			return "gateway: " + err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"phase":"Bound"`) {
			return fmt.Sprintf("gateway GET claim: %d %s", resp.StatusCode, b)
		}
		return ""
	})
	if err := client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "dynamic", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, 2*time.Minute, func() string {
		if _, err := client.CoreV1().PersistentVolumes().Get(ctx, provisioned.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("PV %s (reclaim policy Delete) still there: %v", provisioned.Name, err)
		}
		return ""
	})
	for _, p := range procs {
		if s := p.ExitStatus(); s != "" {
			t.Errorf("%s exited: %s", p.Name, s)
		}
	}
}

var (
	// hostPort is a Service or pod address with one of the manifests'
	// ports, or a bare :port listen address.
	hostPort = regexp.MustCompile(`(?:[A-Za-z0-9$().-]*):(7701|7702|7703|7704|8443|2379|9090)\b`)
	envVar   = regexp.MustCompile(`\$\(([A-Z_][A-Z0-9_]*)\)`)
)

// localize translates one rendered argument to this machine.
func localize(t *testing.T, arg string, vars map[string]string, mounts []corev1.VolumeMount, volumes map[string]string, ports map[string]string) string {
	arg = envVar.ReplaceAllStringFunc(arg, func(m string) string {
		v, ok := vars[envVar.FindStringSubmatch(m)[1]]
		if !ok {
			t.Fatalf("%q names a variable its container does not set", arg)
		}
		return v
	})
	arg = hostPort.ReplaceAllStringFunc(arg, func(m string) string {
		port := m[strings.LastIndex(m, ":")+1:]
		if port == "9090" {
			return "127.0.0.1:0" // each pod's own debug port
		}
		return "127.0.0.1:" + ports[port]
	})
	// Longest mount path first (one may lie under another); a mount path
	// counts only as a whole path prefix (/csi in unix:///csi/csi.sock,
	// once).
	sorted := append([]corev1.VolumeMount{}, mounts...)
	sort.Slice(sorted, func(i, j int) bool { return len(sorted[i].MountPath) > len(sorted[j].MountPath) })
	for _, m := range sorted {
		re := regexp.MustCompile(`(^|[=/,])` + regexp.QuoteMeta(m.MountPath) + `(/|,|$)`)
		arg = re.ReplaceAllString(arg, "${1}"+volumes[m.Name]+"${2}")
	}
	return arg
}

// writeSecret writes a certificate Secret's files as cert-manager makes
// them (deploy/kubernetes/certificates.yaml) for the workload.
func writeSecret(t *testing.T, ca *pki.CA, dir, workload string) {
	t.Helper()
	f, err := ca.Issue(workload)
	if err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]string{f.CAFile: "ca.crt", f.CertFile: "tls.crt", f.KeyFile: "tls.key"} {
		copyFile(t, src, filepath.Join(dir, dst))
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// impersonating writes a copy of the admin kubeconfig that impersonates
// user and returns its path.
func impersonating(t *testing.T, admin *clientcmdapi.Config, path, user string) string {
	t.Helper()
	cfg := admin.DeepCopy()
	for _, a := range cfg.AuthInfos {
		a.Impersonate = user
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
