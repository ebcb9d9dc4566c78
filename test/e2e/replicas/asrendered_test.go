package replicas

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/volplane/volplane/internal/certs"
	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
	"github.com/volplane/volplane/test/harness/manifests"
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
// ports), the mounted volumes local directories (the certificate Secrets'
// keys, as the kubelet would write them), and $(VAR) the
// values of the containers' downward-API variables. etcd is one of the
// test's own, serving with the same CA (the StatefulSet's etcd image is
// not a volplane binary). The certificate Secrets are those the documented
// step without cert-manager makes (volplane-certs), so every connection
// proves them. Then a bind, a provisioning and a reclaim go through them;
// every process answers its manifest's readiness and liveness probes; and
// when etcd goes away, the replicas that need it are not ready, saying
// why, and stay live, while the gateway stays ready naming them.
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
	// The Secrets as the documented step without cert-manager makes them
	// (volplane-certs): every process below serves and dials with them.
	made, err := certs.Make(certs.Options{StateDir: filepath.Join(root, "certs-state")})
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]*corev1.Secret{}
	for _, s := range made {
		secrets[s.Name] = s
	}
	etcdDir := filepath.Join(root, "etcd-tls")
	writeSecret(t, secrets["volplane-etcd-tls"], nil, etcdDir)
	etcd, err := devenv.StartEtcdTLS(filepath.Join(root, "etcd"), &devenv.EtcdTLS{CAFile: filepath.Join(etcdDir, "ca.crt"),
		CertFile: filepath.Join(etcdDir, "tls.crt"), KeyFile: filepath.Join(etcdDir, "tls.key")})
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
	// debug is each service pod's debug port (its probes' and
	// Prometheus'), by workload.
	debug := map[string]string{}
	containers := map[string]corev1.Container{}
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
			if v.Secret != nil {
				s := secrets[v.Secret.SecretName]
				if s == nil {
					t.Fatalf("%s mounts Secret %s, which volplane-certs does not make", podName, v.Secret.SecretName)
				}
				writeSecret(t, s, v.Secret.Items, d)
			}
			volumes[v.Name] = d
		}
		podPorts := maps.Clone(ports)
		addr, err := devenv.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		podPorts["9090"] = strings.TrimPrefix(addr, "127.0.0.1:")
		debug[workload] = addr
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
				args[i] = localize(t, a, vars, c.VolumeMounts, volumes, podPorts)
			}
			if c.ReadinessProbe != nil {
				containers[workload] = c
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
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(secrets["volplane-gateway-tls"].Data["ca.crt"])
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
	// Each process's /metrics, as Prometheus scrapes it: the metrics of
	// the bind, the provisioning and the reclaim are there.
	scrapeEach(t, debug)
	// The manifests' probes, on each process: ready and live. The gateway's
	// /readyz names no backend as unavailable.
	probe := func(w string, p *corev1.Probe) (int, string) {
		g := p.HTTPGet
		url := "http://" + debug[w] + g.Path
		if g.Scheme == corev1.URISchemeHTTPS {
			url = "https://127.0.0.1:" + ports[strconv.Itoa(int(g.Port.IntVal))] + g.Path
			if g.Port.Type == intstr.String {
				for _, cp := range containers[w].Ports {
					if cp.Name == g.Port.StrVal {
						url = "https://127.0.0.1:" + ports[strconv.Itoa(int(cp.ContainerPort))] + g.Path
					}
				}
			}
		}
		resp, err := hc.Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, w := range []string{"volplane-watcher", "volplane-binder", "volplane-provisioner", "volplane-reclaimer", "volplane-gateway"} {
		c := containers[w]
		e2e.Eventually(t, time.Minute, func() string {
			for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
				if code, body := probe(w, p); code != http.StatusOK || w == "volplane-gateway" && p == c.ReadinessProbe && !strings.Contains(body, `"unavailable":[]`) {
					return fmt.Sprintf("%s %s: %d %s", w, p.HTTPGet.Path, code, body)
				}
			}
			return ""
		})
	}

	// etcd goes away: the replicas that need it turn not ready, saying
	// why, and stay live (a liveness probe must not restart a pod that
	// only waits); the gateway stays ready and names them.
	etcd.Stop()
	for _, w := range []string{"volplane-binder", "volplane-provisioner", "volplane-reclaimer"} {
		c := containers[w]
		e2e.Eventually(t, time.Minute, func() string {
			if code, body := probe(w, c.ReadinessProbe); code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]etcd-session failed: not established") {
				return fmt.Sprintf("%s %s without etcd: %d %s", w, c.ReadinessProbe.HTTPGet.Path, code, body)
			}
			return ""
		})
	}
	gw := containers["volplane-gateway"]
	e2e.Eventually(t, time.Minute, func() string {
		code, body := probe("volplane-gateway", gw.ReadinessProbe)
		if code != http.StatusOK || !strings.Contains(body, `"binder":"NOT_SERVING"`) || !strings.Contains(body, `"unavailable":[`) {
			return fmt.Sprintf("gateway %s without etcd: %d %s", gw.ReadinessProbe.HTTPGet.Path, code, body)
		}
		return ""
	})
	// Liveness holds for longer than the probes' failure budget.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		for _, w := range []string{"volplane-watcher", "volplane-binder", "volplane-provisioner", "volplane-reclaimer", "volplane-gateway"} {
			if code, body := probe(w, containers[w].LivenessProbe); code != http.StatusOK {
				t.Fatalf("%s %s without etcd: %d %s: a liveness probe would restart a pod that only waits", w, containers[w].LivenessProbe.HTTPGet.Path, code, body)
			}
		}
	}
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
		return "127.0.0.1:" + ports[port] // 9090: each pod's own debug port
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

// writeSecret writes a Secret's keys (those of items, when given) into
// dir, as the kubelet mounts a secret volume.
func writeSecret(t *testing.T, s *corev1.Secret, items []corev1.KeyToPath, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for k := range s.Data {
		files[k] = k
	}
	if len(items) > 0 {
		files = map[string]string{}
		for _, it := range items {
			files[it.Key] = it.Path
		}
	}
	for key, path := range files {
		b, ok := s.Data[key]
		if !ok {
			t.Fatalf("Secret %s has no key %s", s.Name, key)
		}
		if err := os.WriteFile(filepath.Join(dir, path), b, 0o600); err != nil {
			t.Fatal(err)
		}
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
